"""The six pipeline stages, each one library function with one signature:

    stage(config, *input_references, sink) -> output_reference

The Prefect tasks (`tasks/*.py`) and the CLI (`python -m searchrl <stage>`) call these and
nothing else, so both run exactly the same code and write the same files under
`run.work_dir`. Each stage removes its `ref.json` first and writes it last, and checks its
input references' files before it reads them and again before it publishes
(`searchrl/refs.py`: reading, writing and locking references). The train stage is
`train/stage.py` (a recipe of named steps, top down); it is wired in here.

`STAGES` says, per stage, which inputs outside the references (data files, contract suites,
overrides, the registry's champion) its result depends on; the config values it depends on
are declared per field in `searchrl.config` (`config.inputs_of(stage)`); the cache key
(tasks/_common.py) adds the code the stage reaches (`searchrl.codehash`).

Over 400 lines because the stage functions share one contract (the stage dir's lock, `ref.json`
removed first and written last, the files a reference vouches for, the inputs in `STAGES`) and
are read against it side by side; each stage's work lives in its own package (validation/,
retrieval/, curriculum/, train/, eval/, gate/), only its wiring is here.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig
from searchrl.curriculum.run import run_curriculum
from searchrl.datasets.io import fingerprint, read_passages, read_qa
from searchrl.datasets.sources import source_fingerprint
from searchrl.eval.results import RESULTS_FILE, EvalResult, load_eval_result
from searchrl.eval.run import SETS_DIR, evaluate_stage, policy_selection
from searchrl.gate.report import count_rows, stage_costs, write_gate_report
from searchrl.models.prior import is_bundled_prior, prior_fingerprint
from searchrl.paths import StagePaths
from searchrl.ray_engine import open_engine
from searchrl.refs import (
    REF_FILE,
    REF_FORMAT,
    ReplacedInputError,
    StageInputError,
    begin,
    begin_fresh,
    check_inputs,
    files_of,
    finish,
    read_ref,
    ref_is_current,
    stage_dir_lock,
    write_ref,
)
from searchrl.retrieval.index_store import MAIN_CORPUS, build_indexes
from searchrl.retrieval.provider import SearcherProvider, searchers_for
from searchrl.sinks import MetricsSink
from searchrl.train.cold_start.build import cold_start
from searchrl.train.rejection_sampling import SAMPLES_FILE, write_estimate_samples
from searchrl.train.stage import train_policy
from searchrl.types import (
    CheckpointRef,
    CurriculumRef,
    DatasetRef,
    Decision,
    EvalRef,
    IndexRef,
)
from searchrl.validation.drift import history_dir, keep_digest
from searchrl.validation.validate import QuarantineThresholdError
from searchrl.validation.validate import validate_gold_labels as run_validation

# What the task layer, the CLI and the flows read from here (the stages' wiring): the
# references' helpers live in searchrl/refs.py, the train stage in searchrl/train/stage.py.
__all__ = ["REF_FILE", "REF_FORMAT", "STAGES", "GateInputError", "ReplacedInputError", "Stage",
           "StageInputError", "build_index", "check_inputs", "corpora_of",
           "decide_go_no_go", "eval_sets_of", "evaluate_policy", "files_of",
           "filter_curriculum", "read_ref", "ref_is_current", "refuse_search_failures",
           "train_policy", "validate_gold_labels", "write_ref"]





# --- 1. validate_gold_labels


def validate_gold_labels(config: PipelineConfig, sink: MetricsSink) -> DatasetRef:
    """Contracts, quarantine and audit report; the clean splits and corpora as a DatasetRef."""
    out_dir = StagePaths(config.run.work_dir).validate_dir
    with stage_dir_lock(out_dir):
        begin(out_dir)
        sink.log_params(config.to_dict()["validate"])
        try:
            result = run_validation(config, out_dir)
        except QuarantineThresholdError as exc:
            # The run fails, but the steward needs the report to act on: log it first.
            for report in exc.report_paths:
                sink.log_artifact(report, "validation")
            raise
        sink.log_metrics(result.metrics())
        for artifact in (result.report_html, result.report_md, result.audit_path,
                         result.quarantine_path):
            if artifact is not None:
                sink.log_artifact(artifact, "validation")
        paths = {name: str(p) for name, p in result.split_paths.items()}
        fingerprints = {name: fingerprint(p) for name, p in result.split_paths.items()}
        corpus_fp = fingerprint(result.corpus_path)
        extra = {name: str(p) for name, p in result.extra_corpora.items()}
        evals = {name: str(p) for name, p in result.extra_evals.items()}
        eval_fps = {name: fingerprint(p) for name, p in evals.items()}
        sink.set_tags({f"data.{k}": v for k, v in fingerprints.items()} | {"data.corpus": corpus_fp}
                      | {f"data.extra_eval.{k}": v for k, v in eval_fps.items()})
        combined = "|".join(f"{k}={v}" for k, v in sorted(fingerprints.items()))
        evals_fp = "|".join(f"extra_eval.{k}={v}" for k, v in sorted(eval_fps.items()))
        extra_fp = "|".join(f"{k}={fingerprint(v)}" for k, v in sorted(extra.items()))
        return finish(DatasetRef(
            paths=paths, fingerprints=fingerprints, corpus_path=str(result.corpus_path),
            corpus_fingerprint=corpus_fp,
            fingerprint="|".join(p for p in (combined, evals_fp, f"corpus={corpus_fp}", extra_fp)
                                 if p),
            extra_corpora=extra, extra_evals=evals,
            # The gold-set digest too: a GO keeps it as the champion's (drift's reference).
            files=files_of(*paths.values(), *evals.values(), result.corpus_path, *extra.values(),
                           result.digest_dir),
            mlflow_run_id=sink.run_id,
            report_path=str(result.report_html) if result.report_html else None,
            digest_dir=str(result.digest_dir) if result.digest_dir else None), out_dir)


def _validation_inputs(config: PipelineConfig) -> str:
    """Data sources + the suites + the stewards' overrides: editing any re-runs validation."""
    cfg = config.validate_
    parts = [source_fingerprint(config.data)]
    contracts = Path(cfg.contracts_dir)
    for path in sorted(contracts.glob("*.py")) if contracts.is_dir() else []:
        parts.append(f"{path.name}={fingerprint(path)}")
    if cfg.overrides_path is not None and Path(cfg.overrides_path).is_file():
        parts.append(f"overrides={fingerprint(cfg.overrides_path)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# --- 2. build_index


def corpora_of(dataset: DatasetRef) -> tuple[dict[str, Path], dict[str, dict[str, Path]]]:
    """(corpus name -> corpus file, corpus name -> {eval set name -> QA file}).

    The main corpus is measured on the dev/test splits; each extra eval set `n`
    (data.extra_eval.<n>) on its own corpus `n` (data.extra_corpus.<n>).
    """
    corpora = {MAIN_CORPUS: Path(dataset.corpus_path)}
    evals: dict[str, dict[str, Path]] = {
        MAIN_CORPUS: {s: Path(dataset.paths[s]) for s in ("dev", "test") if s in dataset.paths}}
    for name, qa_path in sorted(dataset.extra_evals.items()):
        if name not in dataset.extra_corpora:
            raise StageInputError(
                f"extra eval set {name!r} has no corpus: set data.extra_corpus.{name} in the "
                f"config (corpora: {sorted(dataset.extra_corpora)})")
        corpora[name] = Path(dataset.extra_corpora[name])
        evals[name] = {name: Path(qa_path)}
    return corpora, evals


def build_index(config: PipelineConfig, dataset: DatasetRef, sink: MetricsSink) -> IndexRef:
    """BM25 / dense / hybrid indexes of every corpus, poisoning scan, recall@k."""
    stage_dir = StagePaths(config.run.work_dir).index_dir
    with stage_dir_lock(stage_dir):
        check_inputs("build_index", dataset)
        begin(stage_dir)
        sink.log_params(config.to_dict()["index"])
        corpora, evals = corpora_of(dataset)
        with open_engine(config.engine) as engine:  # dense embedding shards run on it
            combined, results = build_indexes(corpora, evals, stage_dir, config.index, sink,
                                              engine=engine)
        sink.log_metrics({"passages": float(sum(r.passages for r in results)),
                          "build_seconds": sum(r.build_seconds for r in results),
                          "index_bytes": float(sum(r.index_bytes for r in results))})
        sink.log_artifact(stage_dir / "report.json", "index")
        sink.set_tags({"index.fingerprint": combined, "index.retriever": config.index.retriever})
        # The manifest is written last by build_indexes and names every component's fingerprint.
        return finish(IndexRef(index_dir=str(stage_dir), fingerprint=combined,
                                retriever=config.index.retriever,
                                files=files_of(stage_dir / "manifest.json"),
                                mlflow_run_id=sink.run_id), stage_dir, (dataset,))


# --- 3. filter_curriculum


def filter_curriculum(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                      sink: MetricsSink, *, searchers: SearcherProvider | None = None
                      ) -> CurriculumRef:
    """The cold-start policy (into train_policy/sft, reused by training), its difficulty
    estimate per question, zero-variance questions dropped, the rest ordered."""
    started = time.perf_counter()
    paths = StagePaths(config.run.work_dir)
    with stage_dir_lock(paths.curriculum_dir):
        check_inputs("filter_curriculum", dataset, index)
        begin(paths.curriculum_dir)
        train_path = Path(dataset.paths["train"])
        sink.log_params(config.to_dict()["curriculum"])
        searcher = searchers_for(config, searchers).searcher(index.index_dir)
        sft_dir = cold_start(config, read_qa(train_path), read_passages(dataset.corpus_path),
                             searcher, paths.train_dir / "sft", sink)
        result = run_curriculum(config, train_path, sft_dir, searcher, paths.curriculum_dir)
        # Its correct samples, which rejection sampling fine-tunes on instead of sampling again.
        samples = write_estimate_samples(paths.curriculum_dir / SAMPLES_FILE, result.records,
                                         policy_dir=sft_dir, config=config)
        sink.log_metrics({k: float(v) for k, v in result.counts.items()}
                         | {"mean_pass_rate": result.mean_pass_rate})
        for artifact in (result.train_path, result.difficulty_path, result.dropped_path,
                         result.histogram_path):
            sink.log_artifact(artifact, "curriculum")
        return finish(CurriculumRef(
            train_path=str(result.train_path), fingerprint=fingerprint(result.train_path),
            difficulty_path=str(result.difficulty_path), dropped_path=str(result.dropped_path),
            samples_path=str(samples), files=files_of(result.train_path, sft_dir, samples),
            seconds=time.perf_counter() - started, mlflow_run_id=sink.run_id),
            paths.curriculum_dir, (dataset, index))


# --- 4. train_policy: train/stage.py (the stage as a recipe of named steps)


# --- 5. evaluate_policy


def eval_sets_of(config: PipelineConfig, dataset: DatasetRef) -> dict[str, str]:
    """The extra eval sets to evaluate (name -> QA file): `eval.eval_sets`, "all" = every
    extra eval set the validated dataset holds."""
    present = dict(sorted(dataset.extra_evals.items()))
    wanted = config.eval.eval_sets
    if wanted == "all":
        return present
    missing = [n for n in wanted if n not in present]
    if missing:
        raise StageInputError(f"eval.eval_sets names {missing}, not in the validated dataset "
                              f"(extra eval sets: {sorted(present)}; add them under "
                              "data.extra_eval / data.extra_corpus)")
    return {n: present[n] for n in wanted}


def evaluate_policy(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                    checkpoint: CheckpointRef, sink: MetricsSink, *,
                    searchers: SearcherProvider | None = None) -> EvalRef:
    """The trained policy and the baselines on the eval split and on each extra eval set, each
    searched in its own corpus (greedy, same rollout loop); the registry champion is looked
    up in the sink's tracking store."""
    started = time.perf_counter()
    out_dir = StagePaths(config.run.work_dir).eval_dir
    with stage_dir_lock(out_dir):
        check_inputs("evaluate_policy", dataset, index, checkpoint)
        begin_fresh(out_dir)
        split = config.eval.split
        if split not in dataset.paths:
            raise StageInputError(f"eval.split={split!r} is not in the validated dataset "
                                  f"(splits: {sorted(dataset.paths)})")
        extra_sets = eval_sets_of(config, dataset)
        sink.log_params(config.to_dict()["eval"])
        sink.set_tags({"data.eval": dataset.fingerprints.get(split, ""),
                       "policy": checkpoint.fingerprint})
        with open_engine(config.engine) as engine:  # rollout chunks run on it
            result = evaluate_stage(
                config, eval_path=dataset.paths[split], index_dir=index.index_dir,
                policy_dir=checkpoint.policy_dir, sft_dir=checkpoint.sft_dir,
                rs_dir=checkpoint.rs_dir, out_dir=out_dir, tracking_uri=sink.tracking_uri,
                extra_sets=extra_sets, selection=policy_selection(checkpoint),
                train_path=dataset.paths.get("train"),
                searchers=searchers_for(config, searchers), engine=engine)
        metrics: dict[str, float] = {"n_questions": result.n_questions,
                                     "suspect_labels": result.n_suspects}
        for name, s in result.systems.items():
            summary = s.summary
            metrics |= {f"{name}.em": summary.em.mean, f"{name}.em_lo": summary.em.lo,
                        f"{name}.em_hi": summary.em.hi, f"{name}.f1": summary.f1.mean,
                        f"{name}.searches_per_question": summary.searches_per_question,
                        f"{name}.format_rate": summary.format_rate,
                        f"{name}.tokens_per_query": summary.tokens_per_query,
                        f"{name}.latency_s": summary.latency_s}
        for name, d in result.deltas.items():
            metrics |= {f"delta_em.{name}": d.mean, f"delta_em.{name}_lo": d.lo,
                        f"delta_em.{name}_hi": d.hi}
        for set_name, one in result.extra_sets.items():
            metrics[f"{set_name}/n_questions"] = float(one.n_questions)
            for name, summary in one.systems.items():
                metrics |= {f"{set_name}/{name}.em": summary.em.mean,
                            f"{set_name}/{name}.em_lo": summary.em.lo,
                            f"{set_name}/{name}.em_hi": summary.em.hi,
                            f"{set_name}/{name}.f1": summary.f1.mean,
                            f"{set_name}/{name}.searches_per_question":
                                summary.searches_per_question,
                            f"{set_name}/{name}.format_rate": summary.format_rate}
            for name, d in one.deltas.items():
                metrics[f"{set_name}/delta_em.{name}"] = d.mean
        sink.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)})
        # Top-level files only: a downloaded champion policy is not an evaluation artifact.
        for path in sorted(out_dir.iterdir()):
            if path.is_file():
                sink.log_artifact(path, "evaluation")
        if (out_dir / SETS_DIR).is_dir():
            sink.log_artifact(out_dir / SETS_DIR, "evaluation")
        results_path = out_dir / RESULTS_FILE
        return finish(EvalRef(results_path=str(results_path),
                               fingerprint=fingerprint(results_path),
                               files=files_of(results_path), mlflow_run_id=sink.run_id,
                               seconds=time.perf_counter() - started, devices=1), out_dir,
                       (dataset, index, checkpoint))


def _champion_version(config: PipelineConfig) -> str:
    """A newly registered champion invalidates the cached evaluation."""
    if "champion" not in config.eval.baselines:
        return "champion:not-requested"
    return _registered_champion(config)


def _registered_champion(config: PipelineConfig) -> str:
    """`champion:<model>:<version>` (`none` when nothing is registered), for cache keys."""
    from searchrl.tracking import registered_policy, resolve_tracking_uri

    name = config.registry_model_name
    try:
        uri = resolve_tracking_uri(config.tracking.tracking_uri)
        found = registered_policy(uri, name, config.eval.champion_alias)
    except Exception:  # an unreachable store must not break cache-key computation
        return f"champion:{name}:unknown"
    return f"champion:{name}:{found['version'] if found else 'none'}"


def _base_model(config: PipelineConfig) -> str:
    """The bundled MiniLM prior's package files (weights, vocabulary) when the policy starts
    from it: the cold start is prepared from them, so a new release of the package prepares
    it again. Empty for any other model (its name or path is in the config's part)."""
    if not is_bundled_prior(config.model.name_or_path):
        return ""
    return f"prior={prior_fingerprint()}"


def _train_inputs(config: PipelineConfig) -> str:
    """train.init=champion: the champion version training starts from is a training input;
    so are the contents of train.deepspeed_config (its path alone is in the config's part)
    and the bundled prior's files (the cold start training may build)."""
    start = _registered_champion(config) if config.train.init == "champion" else "init:base"
    deepspeed = config.train.deepspeed_config_sha256()
    parts = [start, f"deepspeed_config={deepspeed}" if deepspeed is not None else "",
             _base_model(config)]
    return "|".join(p for p in parts if p)


# --- 6. decide_go_no_go


def decide_go_no_go(config: PipelineConfig, dataset: DatasetRef,
                    curriculum: CurriculumRef | None, checkpoint: CheckpointRef,
                    evaluation: EvalRef, sink: MetricsSink) -> Decision:
    """Cost-payback gate and report; on GO the policy is registered in the sink's store.

    Compute is charged per stage (wall time x devices), as each stage's reference recorded
    it: curriculum (cold start + difficulty estimate; None: not counted, and the report says
    so), training and evaluation."""
    paths = StagePaths(config.run.work_dir)
    out_dir = paths.gate_dir
    with stage_dir_lock(out_dir):
        check_inputs("decide_go_no_go", dataset, curriculum, checkpoint, evaluation)
        begin_fresh(out_dir)
        sink.log_params(config.to_dict()["gate"])
        costs, notes = stage_costs(curriculum, checkpoint, evaluation)
        evaluated = load_eval_result(evaluation.results_path)
        refuse_search_failures(evaluated, evaluation.results_path)
        tracked = sink.tracking_uri is not None and sink.run_id is not None
        finished = _finish_promotion(config, sink.tracking_uri) if tracked else None
        champion = _current_champion(config, sink.tracking_uri) if tracked else None
        plan = _plan_promotion(config, sink.tracking_uri, checkpoint, champion) if tracked \
            else _Promotion(blocked=_FROZEN if config.gate.freeze_promotions else None)
        outcome = write_gate_report(
            config, evaluated, out_dir,
            gold_pairs=count_rows(dataset.paths.get("train")), stages=costs,
            metrics_path=checkpoint.metrics_path,
            cost_notes=[*notes, *([plan.blocked] if plan.blocked else [])],
            champion_version=champion)
        # Again before anything is logged, registered or kept: the numbers decided on, the
        # policy registered and the gold set kept are still this run's.
        check_inputs("decide_go_no_go", dataset, curriculum, checkpoint, evaluation)
        result = outcome.result
        sink.set_tags({"decision": result.label}
                      | ({"promotion_blocked": plan.blocked[:5000]} if plan.blocked else {}))
        sink.log_metrics({k: v for k, v in outcome.figures.items() if math.isfinite(v)})
        sink.log_artifact(out_dir, "report")
        if tracked:
            sink.set_tags(_register_candidate(config, dataset, checkpoint, evaluation,
                                              outcome.figures, go=result.go, sink=sink,
                                              plan=plan))
        # The retry of a gate the store interrupted mid-promotion keeps its gold set, as the
        # uninterrupted gate would have.
        promoted = plan.blocked is None or (finished is not None and finished == plan.existing)
        if (result.go and promoted and dataset.digest_dir
                and Path(dataset.digest_dir).is_dir()):
            # The champion's gold set: what the next validation's drift is measured against.
            keep_digest(Path(dataset.digest_dir), history_dir(config.run.work_dir) / "champion")
        return finish(Decision(
            go=result.go, reasons=result.reasons, report_html=str(outcome.html_path),
            report_md=str(outcome.md_path), figures=outcome.figures,
            files=files_of(outcome.html_path, outcome.md_path, outcome.decision_path),
            mlflow_run_id=sink.run_id), out_dir)


def _finish_promotion(config: PipelineConfig, uri: str | None) -> str | None:
    """Finish a promotion the store interrupted (an earlier gate's GO) before this gate reads
    the champion; the version it promoted (None: none was pending)."""
    from searchrl.tracking import finish_promotion

    return None if uri is None else finish_promotion(uri, config.registry_model_name)


def _current_champion(config: PipelineConfig, uri: str | None) -> str | None:
    """The version the registry's champion alias points at (None: none registered)."""
    from searchrl.tracking import registered_policy

    if uri is None:
        return None
    found = registered_policy(uri, config.registry_model_name, config.gate.registry_alias)
    return found["version"] if found else None


_FROZEN = ("Promotions are frozen (gate.freeze_promotions): the decision is recorded and the "
           "candidate registered, the champion is not moved.")


@dataclass(frozen=True)
class _Promotion:
    """What the registry step does with this candidate, settled before the report (which
    says it): `existing` is the registered version already holding its weights (None: a new
    version), `blocked` why a GO moves no alias (None: a GO promotes)."""

    existing: str | None = None
    blocked: str | None = None


def _plan_promotion(config: PipelineConfig, uri: str | None, checkpoint: CheckpointRef,
                    champion: str | None) -> _Promotion:
    """A candidate with a registered version's weights is that version: the champion's own
    (a re-run after a GO) is not registered again; a rolled-back one (a scheduled run after
    a rollback) is not promoted again. A freeze blocks every promotion."""
    from searchrl.tracking import version_with_weights, was_rolled_back, weights_digest

    assert uri is not None
    found = version_with_weights(uri, config.registry_model_name,
                                 weights_digest(Path(checkpoint.policy_dir)),
                                 Path(checkpoint.policy_dir))
    existing, tags = found if found else (None, {})
    blocked = _FROZEN if config.gate.freeze_promotions else None
    if existing is not None and existing == champion:
        blocked = (f"This candidate's weights are the champion's (registered version "
                   f"{existing}): not registered again, and there is nothing to promote.")
    elif existing is not None and was_rolled_back(tags):
        blocked = (f"This candidate's weights are registered version {existing}'s, rolled back "
                   f"at {tags['rolled_back_at']} ({tags.get('rolled_back_reason', '')}): not "
                   f"promoted again. To restore it on purpose: `python -m searchrl rollback "
                   f"--to {existing} --reason TEXT`.")
    return _Promotion(existing=existing, blocked=blocked)


def _register_candidate(config: PipelineConfig, dataset: DatasetRef, checkpoint: CheckpointRef,
                        evaluation: EvalRef, figures: dict[str, float], *, go: bool,
                        sink: MetricsSink, plan: _Promotion) -> dict[str, str]:
    """Every candidate becomes a version aliased `challenger`, tagged with the decision, its
    figures and data fingerprints (a candidate with a registered version's weights is that
    version, tagged with this gate's decision and run: `plan`); a GO that `plan` does not
    block moves `champion` to it (the replaced version kept as `previous-champion`). The policy's
    artifact is the MLflow model the training run logged, when it did (stored once).
    Returns the run tags that say so."""
    from searchrl.tracking import (
        CHALLENGER,
        logged_policy_model,
        promote,
        register_policy,
        set_version_tags,
    )

    assert sink.tracking_uri is not None and sink.run_id is not None
    name = config.registry_model_name
    tags = ({"decision": "GO" if go else "NO-GO", "policy_fingerprint": checkpoint.fingerprint,
             "eval_fingerprint": evaluation.fingerprint, "train_init": config.train.init,
             "run_name": config.run.name, "gate_run_id": sink.run_id}
            | {f"data.{k}": v for k, v in sorted(dataset.fingerprints.items())}
            | {"data.corpus": dataset.corpus_fingerprint}
            | {f"figure.{k}": f"{v:.6g}" for k, v in sorted(figures.items())})
    if plan.existing is not None:
        # Its own registration's record stays as it was; this gate's is added beside it.
        version = plan.existing
        set_version_tags(sink.tracking_uri, name, version,
                         {"last_decision": tags["decision"], "last_gate_run_id": sink.run_id},
                         alias=CHALLENGER)
    else:
        trained = checkpoint.mlflow_run_id
        logged = logged_policy_model(sink.tracking_uri, trained) if trained else None
        version = register_policy(sink.tracking_uri, trained if trained and logged else sink.run_id,
                                  Path(checkpoint.policy_dir), name, CHALLENGER, tags=tags,
                                  logged_model=logged)
    out = {"registered_model": name, "registered_version": version,
           "registered_new": str(plan.existing is None).lower()}
    if go and plan.blocked is None:
        replaced = promote(sink.tracking_uri, name, version, config.gate.registry_alias)
        out |= {"promoted_to": config.gate.registry_alias,
                "previous_champion": replaced or "none"}
    return out


class GateInputError(RuntimeError):
    """The evaluation the gate would decide on is not a measurement of the systems."""


def refuse_search_failures(result: EvalResult, results_path: str) -> None:
    """Fail closed: a system whose evaluation saw failed searches (below the rollout's limit,
    or a results file from before it) measured the retriever, not itself; no decision."""
    failed = {name: s.summary.search_errors for name, s in result.systems.items()
              if s.summary.search_errors}
    for set_name, one in result.extra_sets.items():
        failed |= {f"{set_name}/{name}": s.search_errors for name, s in one.systems.items()
                   if s.search_errors}
    if failed:
        listed = ", ".join(f"{name}: {n}" for name, n in sorted(failed.items()))
        raise GateInputError(
            f"{results_path}: failed searches during evaluation ({listed}); the gate does not "
            "decide on them. Fix the retriever and re-run evaluate_policy (the stages before it "
            "are reused)")


# --- the table the task layer and the CLI are built from


@dataclass(frozen=True)
class Stage:
    """One stage: its function and the inputs outside its references that it reads
    (fingerprinted into the cache key). The config values its result depends on are
    `config.inputs_of(name)`: declared per field in searchrl/config/."""

    name: str
    run: Callable[..., Any]
    external_inputs: Callable[[PipelineConfig], str] | None = None

    def input_kinds(self) -> list[tuple[type, bool]]:
        """The reference types the stage takes after its config, each with whether it is
        optional: the positional parameters between `config` and `sink` (keyword options are
        not inputs)."""
        hints = typing.get_type_hints(self.run)
        positional = [p.name for p in inspect.signature(self.run).parameters.values()
                      if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        kinds: list[tuple[type, bool]] = []
        for name in positional[1:-1]:  # (config, *refs, sink, *, keyword options) -> ref
            hint = hints[name]
            optional = isinstance(hint, types.UnionType) and type(None) in hint.__args__
            kinds.append((next(a for a in hint.__args__ if a is not type(None)) if optional
                          else hint, optional))
        return kinds

    def output_kind(self) -> type:
        """The reference type the stage returns."""
        return typing.get_type_hints(self.run)["return"]  # type: ignore[no-any-return]

    def upstream(self) -> list[str]:
        """The stages whose references it takes, in its parameters' order."""
        producer = {s.output_kind(): n for n, s in STAGES.items()}
        return [producer[kind] for kind, _ in self.input_kinds()]


STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("validate_gold_labels", validate_gold_labels, _validation_inputs),
    Stage("build_index", build_index),
    Stage("filter_curriculum", filter_curriculum, _base_model),
    Stage("train_policy", train_policy, _train_inputs),
    Stage("evaluate_policy", evaluate_policy, _champion_version),
    Stage("decide_go_no_go", decide_go_no_go),
)}
