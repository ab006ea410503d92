"""Stage 5 library entry: every system on the same eval questions and retriever, greedy, with
the training rollout loop; metrics with bootstrap intervals; the label-noise audit.

Writes under `out_dir` (each file atomically; `results.json` last, so its presence means the
evaluation is complete):

    questions_<system>.jsonl     one QuestionResult per question (with a manifest)
    trajectories_<system>.jsonl  the decoded trajectory, answer, queries per question
    suspect_labels.jsonl         the audit's suspects, one tiered row per question, ranked
                                 (with a manifest; a steward fills `decision`, then runs
                                 `python -m searchrl apply-audit --decisions FILE`)
    suspect_labels_train.jsonl   the same audit of the SFT policy's greedy rollouts on
                                 `eval.audit_train_questions` sampled train questions
    sets/<name>/                 the same files for each extra eval set (its own corpus)
    results.json                 summaries, breakdowns (by retrieval confidence too, with
                                 its cut points), paired deltas, notes, audit tier counts
                                 (EvalResult), and each extra set's summaries (written after
                                 every set)

The result types and their readers are in `searchrl.eval.results`.

With a Ray engine (`engine.kind: ray`, `searchrl.ray_engine`) each system's questions are cut
into the same `eval.batch_size` chunks as here and the chunks run on the engine's workers,
each holding one policy and one searcher (loaded from the corpus index every node sees), so
every question gets the rollout it gets locally (tests/faults/test_ray_engine.py). Systems
still run one after another; the scripted system and an endpoint (the frontier) run here.

Over 400 lines because every system and eval set, the audit and `results.json` share the
written-last contract above and the same chunks (local or on the engine).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from searchrl.config import PipelineConfig
from searchrl.datasets.io import atomic_write_text, manifest_path, read_qa, write_jsonl
from searchrl.datasets.sources import extra_eval_split
from searchrl.eval.audit import (
    audit_rollouts,
    final_turn_confidence,
    find_suspects,
    pool_suspects,
    retrieved_ids,
    tier_counts,
)
from searchrl.eval.baselines import (
    TRAINED,
    SystemSpec,
    is_endpoint,
    plan_systems,
    system_policy,
)
from searchrl.eval.label_studio import TASKS_SUFFIX, write_label_studio
from searchrl.eval.metrics import (
    QuestionResult,
    align,
    breakdown,
    by_confidence,
    by_hops,
    by_searched,
    by_slices,
    by_type,
    paired_bootstrap_delta,
    summarize,
    tercile_cuts,
)
from searchrl.eval.results import (
    RESULTS_FILE,
    AuditSummary,
    EvalResult,
    SetResult,
    SystemResult,
    eval_result_json,
    known_slice_card,
)
from searchrl.eval.scripted import ScriptedSystem
from searchrl.generation.factory import make_generator
from searchrl.generation.openai_compat import (
    MeteredEndpoint,
    RequestBudgetExceeded,
    TokenUsage,
)
from searchrl.paths import safe_filename
from searchrl.ray_engine import RayEngine, WorkerState
from searchrl.retrieval.base import Searcher
from searchrl.retrieval.index_store import MAIN_CORPUS, load_corpus_searcher, resolve_corpus
from searchrl.retrieval.provider import SearcherProvider
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rewards import exact_match, f1
from searchrl.rl.rollout import run_rollouts
from searchrl.types import CheckpointRef, QAExample


def to_question_result(rec: RolloutRecord, ex: QAExample, latency_s: float) -> QuestionResult:
    """Reduce one greedy trajectory to its metrics.

    EM/F1 are recomputed from the extracted answer (whatever `reward.kind` trained on);
    `searches` counts the policy's own searches (retrieve_once's template retrieval is not
    one); input tokens are the prompt plus everything inserted (information, glue), response
    tokens are what the policy generated.
    """
    answer = rec.answer
    sampled = sum(rec.loss_mask)
    support = None
    if ex.supporting_doc_ids:
        got = set(retrieved_ids(rec))
        support = any(d in got for d in ex.supporting_doc_ids)
    return QuestionResult(
        example_id=ex.id, hops=ex.hops, qtype=ex.type, slices=tuple(ex.slices),
        em=exact_match(answer, ex.golden_answers) if answer is not None else 0.0,
        f1=f1(answer, ex.golden_answers) if answer is not None else 0.0,
        searches=0 if rec.mode == "retrieve_once" else len(rec.queries),
        format_ok=rec.reward_parts.get("format", 0.0) >= 1.0,
        prompt_tokens=len(rec.prompt_ids) + len(rec.response_ids) - sampled,
        response_tokens=sampled, latency_s=latency_s,
        answered=bool(answer and answer.strip()), finish_reason=rec.finish_reason,
        answer=answer, retrieved_support=support, confidence=final_turn_confidence(rec),
        search_errors=rec.search_errors,
        top_score=(rec.retrieval_scores[0][0]
                   if rec.retrieval_scores and rec.retrieval_scores[0] else None),
    )


@dataclass
class _SystemRun:
    results: list[QuestionResult] = field(default_factory=list)
    records: list[RolloutRecord] = field(default_factory=list)
    seconds: float = 0.0
    metered: bool = False  # tokens from a remote endpoint's usage; no token log-probs
    incomplete: str | None = None


@dataclass(frozen=True)
class Remote:
    """Rollouts on an engine's workers, which search `corpus_dir` (the index the local
    searcher of the same evaluation reads)."""

    engine: RayEngine
    corpus_dir: Path


def _rollouts_on_worker(state: WorkerState,
                        item: tuple[PipelineConfig, SystemSpec, Path, list[QAExample]]
                        ) -> tuple[list[RolloutRecord], float]:
    """One chunk of one system on an engine worker: its records and seconds. The worker
    keeps one policy and one searcher, reloaded only when a chunk names another."""
    config, spec, corpus_dir, chunk = item
    if spec.mode == "scripted":
        raise ValueError("the scripted system runs in the stage's process, not on workers")
    generator = state.get("policy", spec.policy,
                          lambda: make_generator(config, **system_policy(spec, config)))
    searcher = state.get("searcher", corpus_dir,
                         lambda: load_corpus_searcher(corpus_dir, config.index))
    t0 = time.perf_counter()
    batch = run_rollouts(chunk, generator, searcher, config.rollout, config.reward,
                         group_size=1, greedy=True, seed=config.run.seed, mode=spec.mode)
    return batch.records, time.perf_counter() - t0


def _run_system_on(remote: Remote, spec: SystemSpec, examples: Sequence[QAExample],
                   config: PipelineConfig,
                   progress: Callable[[str, int, int], None] | None) -> _SystemRun:
    """`_run_system` with its chunks on the engine's workers, merged in question order."""
    step = config.eval.batch_size
    chunks = [list(examples[start:start + step]) for start in range(0, len(examples), step)]
    out = _SystemRun()
    done = 0
    results = remote.engine.map(_rollouts_on_worker,
                                ((config, spec, remote.corpus_dir, c) for c in chunks))
    for chunk, (records, seconds) in zip(chunks, results, strict=True):
        out.seconds += seconds
        by_id = {ex.id: ex for ex in chunk}
        for rec in records:
            out.records.append(rec)
            out.results.append(to_question_result(rec, by_id[rec.example_id],
                                                  seconds / len(chunk)))
        done += len(chunk)
        if progress is not None:
            progress(spec.name, done, len(examples))
    return out


def _run_system(spec: SystemSpec, examples: Sequence[QAExample], searcher: Searcher,
                config: PipelineConfig,
                progress: Callable[[str, int, int], None] | None,
                remote: Remote | None = None) -> _SystemRun:
    """Roll out `spec` greedily on `examples` in batches of `eval.batch_size` (on the
    workers of `remote` when given, unless `spec` is an endpoint).

    A metered system (an endpoint) counts its tokens from the endpoint's usage; when its
    request budget runs out, the batch in flight is dropped and the run is returned marked
    incomplete (the questions answered before it are kept). Other endpoint errors raise:
    an outage must not be cached as a result.
    """
    if spec.mode == "scripted":
        raise ValueError("the scripted system has no policy to roll out: _run_scripted runs it")
    if remote is not None and not is_endpoint(spec):
        return _run_system_on(remote, spec, examples, config, progress)
    mode = spec.mode
    generator = make_generator(config, **system_policy(spec, config))
    meter = generator if isinstance(generator, MeteredEndpoint) else None
    out = _SystemRun(metered=meter is not None)
    step = config.eval.batch_size
    try:
        for start in range(0, len(examples), step):
            chunk = examples[start:start + step]
            t0 = time.perf_counter()
            batch = run_rollouts(chunk, generator, searcher, config.rollout, config.reward,
                                 group_size=1, greedy=True, seed=config.run.seed,
                                 mode=mode)
            per_question = (time.perf_counter() - t0) / len(chunk)
            usage = _usage_by_record(meter.take_usage(), len(batch.records)) if meter else {}
            out.seconds += per_question * len(chunk)
            by_id = {ex.id: ex for ex in chunk}
            for i, rec in enumerate(batch.records):
                result = to_question_result(rec, by_id[rec.example_id], per_question)
                if meter is not None:
                    used = usage.get(i, TokenUsage())
                    result = dataclasses.replace(
                        result, prompt_tokens=used.prompt_tokens,
                        response_tokens=used.completion_tokens, confidence=None)
                out.records.append(rec)
                out.results.append(result)
            if progress is not None:
                progress(spec.name, min(start + step, len(examples)), len(examples))
    except RequestBudgetExceeded as exc:
        out.incomplete = f"{exc}; {len(out.results)} of {len(examples)} questions answered"
    finally:
        if meter is not None:
            meter.close()
    return out


def _run_scripted(spec: SystemSpec, examples: Sequence[QAExample], searcher: Searcher,
                  progress: Callable[[str, int, int], None] | None
                  ) -> tuple[_SystemRun, list[dict[str, Any]]]:
    """The scripted system on `examples`: templates from the train split at `spec.policy`,
    one QuestionResult per question scored by the same metrics, and its trajectory rows."""
    scripted = ScriptedSystem(read_qa(spec.policy), searcher)
    out = _SystemRun()
    rows: list[dict[str, Any]] = []
    for i, ex in enumerate(examples, 1):
        got = scripted.answer(ex.question)
        answer = got.answer
        out.seconds += got.latency_s
        out.results.append(QuestionResult(
            example_id=ex.id, hops=ex.hops, qtype=ex.type, slices=ex.slices,
            em=exact_match(answer, ex.golden_answers) if answer else 0.0,
            f1=f1(answer, ex.golden_answers) if answer else 0.0,
            searches=len(got.queries), format_ok=True, prompt_tokens=0, response_tokens=0,
            latency_s=got.latency_s, answered=bool(answer), finish_reason="scripted",
            answer=answer,
            retrieved_support=(any(d in set(got.retrieved_doc_ids)
                                   for d in ex.supporting_doc_ids)
                               if ex.supporting_doc_ids else None),
            confidence=None, search_errors=0, top_score=got.top_score))
        rows.append({"example_id": ex.id, "mode": "scripted", "answer": answer,
                     "correct": bool(out.results[-1].em), "queries": got.queries,
                     "retrieved_doc_ids": got.retrieved_doc_ids, "qtype_read": got.qtype})
        if progress is not None and (i % 50 == 0 or i == len(examples)):
            progress(spec.name, i, len(examples))
    return out, rows


def _usage_by_record(usage: Mapping[str, TokenUsage], n: int) -> dict[int, TokenUsage]:
    """Endpoint usage per record index: `run_rollouts` names row i of a call `str(i)` (one
    sample per question here, records in row order)."""
    unknown = sorted(set(usage) - {str(i) for i in range(n)})
    if unknown:
        raise RuntimeError(f"endpoint usage for rows {unknown[:5]} that no record has: the "
                           "rollout's row keys changed; update _usage_by_record")
    return {int(k): v for k, v in usage.items()}


def _trajectory_row(rec: RolloutRecord) -> dict[str, Any]:
    return {"example_id": rec.example_id, "mode": rec.mode, "answer": rec.answer,
            "correct": rec.correct, "queries": rec.queries,
            "retrieved_doc_ids": rec.retrieved_doc_ids, "finish_reason": rec.finish_reason,
            "reward_parts": rec.reward_parts, "text": rec.text}


def evaluate(examples: Sequence[QAExample], systems: Sequence[SystemSpec], searcher: Searcher,
             config: PipelineConfig, out_dir: Path, *, eval_set: str,
             notes: Sequence[str] = (),
             progress: Callable[[str, int, int], None] | None = None,
             audit_split: str | None = None, remote: Remote | None = None) -> EvalResult:
    """Run every system greedily on `examples`; write the files in the module docstring
    (results.json last).

    `systems` must include `trained` (the deltas are trained minus each baseline). Suspects
    are pooled over every agentic system, one tiered row per question, naming the systems
    that flagged it (a label several policies disagree with is the stronger suspect).
    `audit_split` is the validated split the questions came from, as steward overrides name it
    (default: `eval_set` up to its first ':').
    """
    result = _evaluate_systems(examples, systems, searcher, config, out_dir, eval_set=eval_set,
                               notes=notes, progress=progress, audit_split=audit_split,
                               remote=remote)
    write_results(result, out_dir)
    return result


def write_results(result: EvalResult, out_dir: Path) -> Path:
    path = out_dir / RESULTS_FILE
    atomic_write_text(path, eval_result_json(result))
    return path


def _evaluate_systems(examples: Sequence[QAExample], systems: Sequence[SystemSpec],
                      searcher: Searcher, config: PipelineConfig, out_dir: Path, *,
                      eval_set: str, notes: Sequence[str],
                      progress: Callable[[str, int, int], None] | None,
                      audit_split: str | None = None,
                      remote: Remote | None = None) -> EvalResult:
    """`evaluate` without results.json (the caller writes it once everything is in)."""
    if not examples:
        raise ValueError(f"eval set {eval_set!r} is empty: nothing to evaluate")
    if TRAINED not in {s.name for s in systems}:
        raise ValueError("evaluate: the systems must include the trained policy")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULTS_FILE).unlink(missing_ok=True)
    cfg = config.eval
    samples, level, seed = cfg.bootstrap_samples, cfg.confidence_level, config.run.seed
    by_id = {ex.id: ex for ex in examples}
    runs: dict[str, SystemResult] = {}
    per_question: dict[str, list[QuestionResult]] = {}
    flagged: list[dict[str, Any]] = []
    audited: list[str] = []  # agentic systems with token log-probs (the audit's confidence)
    incomplete: list[str] = []
    for spec in systems:
        if spec.mode == "scripted":
            run, trajectories = _run_scripted(spec, examples, searcher, progress)
        else:
            run = _run_system(spec, examples, searcher, config, progress, remote)
            trajectories = [_trajectory_row(r) for r in run.records]
        if run.incomplete is not None:
            incomplete.append(f"{spec.name} is INCOMPLETE: {run.incomplete}")
        qpath = out_dir / f"questions_{spec.name}.jsonl"
        tpath = out_dir / f"trajectories_{spec.name}.jsonl"
        write_jsonl(qpath, [r.to_dict() for r in run.results])
        write_jsonl(tpath, trajectories)
        per_question[spec.name] = run.results
        runs[spec.name] = SystemResult(
            spec=spec, summary=summarize(run.results, samples=samples, level=level, seed=seed),
            by_hops=breakdown(run.results, by_hops, samples=samples, level=level, seed=seed),
            by_type=breakdown(run.results, by_type, samples=samples, level=level, seed=seed),
            by_searched=breakdown(run.results, by_searched, samples=samples, level=level,
                                  seed=seed),
            by_slice=by_slices(run.results, samples=samples, level=level, seed=seed),
            questions_path=str(qpath), trajectories_path=str(tpath), seconds=run.seconds,
            incomplete=run.incomplete)
        if spec.mode == "agentic" and not run.metered:
            audited.append(spec.name)
            flagged += find_suspects(run.records, by_id, system=spec.name,
                                     min_confidence=cfg.audit_min_confidence,
                                     near_miss_ratio=cfg.audit_near_miss_ratio)
    # One set of cut points for every system: the trained policy's terciles, so a bucket is
    # the same score range whichever system landed in it.
    trained = per_question[TRAINED]
    cuts = tercile_cuts([r.top_score for r in trained if r.searched and r.top_score is not None])
    for name, results in per_question.items():
        runs[name] = dataclasses.replace(runs[name], by_confidence=breakdown(
            results, by_confidence(cuts), samples=samples, level=level, seed=seed))
    deltas = {}
    for name, results in per_question.items():
        if name == TRAINED:
            continue
        a, b = align(trained, results)
        deltas[name] = paired_bootstrap_delta([r.em for r in a], [r.em for r in b],
                                              samples=samples, level=level, seed=seed)
    agentic = tuple(audited)
    split = audit_split if audit_split is not None else eval_set.split(":", 1)[0]
    suspects = pool_suspects(flagged, dict.fromkeys(by_id, len(agentic)), split=split)
    spath = out_dir / "suspect_labels.jsonl"
    write_jsonl(spath, suspects)
    write_label_studio(spath, suspects)  # the same queue as a Label Studio import
    audit = AuditSummary(path=str(spath), split=split, n_questions=len(examples),
                         systems=agentic, tiers=tier_counts(suspects))
    return EvalResult(eval_set=eval_set, n_questions=len(examples), systems=runs,
                      deltas=deltas, suspects_path=str(spath), n_suspects=len(suspects),
                      notes=(*notes, *incomplete), level=cfg.confidence_level, audit=audit,
                      confidence_cuts=cuts,
                      slice_card=known_slice_card(sorted({s for ex in examples
                                                          for s in ex.slices})))


# --- the stage entry


SETS_DIR = "sets"
TRAIN_SUSPECTS_FILE = "suspect_labels_train.jsonl"


def audit_train_split(config: PipelineConfig, train_path: str | Path | None, policy_dir: str,
                      searcher: Searcher, out_dir: Path, *, system: str = "sft",
                      progress: Callable[[str, int, int], None] | None = None,
                      remote: Remote | None = None) -> AuditSummary | None:
    """The label-noise audit of the train split's gold labels: `eval.audit_train_questions`
    questions sampled with `run.seed`, rolled out greedily by `policy_dir` (the SFT start: it
    has not been rewarded towards the train golds), pooled and tiered like the eval audit.
    None (and no file) when the cap is 0 or there is no train split."""
    path = out_dir / TRAIN_SUSPECTS_FILE
    path.unlink(missing_ok=True)
    path.with_name(path.stem + TASKS_SUFFIX).unlink(missing_ok=True)
    manifest_path(path).unlink(missing_ok=True)
    n = config.eval.audit_train_questions
    if n == 0 or train_path is None or not Path(train_path).is_file():
        return None
    rows = read_qa(train_path)
    sample = random.Random(config.run.seed).sample(rows, min(n, len(rows)))
    if not sample:
        return None
    spec = SystemSpec(system, policy_dir, "agentic", "label-noise audit of the train split")
    run = _run_system(spec, sample, searcher, config, progress, remote)
    suspects = audit_rollouts(run.records, {ex.id: ex for ex in sample}, split="train",
                              min_confidence=config.eval.audit_min_confidence,
                              near_miss_ratio=config.eval.audit_near_miss_ratio, system=system)
    write_jsonl(path, suspects)
    write_label_studio(path, suspects)
    return AuditSummary(path=str(path), split="train", n_questions=len(sample),
                        systems=(system,), tiers=tier_counts(suspects))


def progress_bars() -> Callable[[str, int, int], None]:
    """A progress callback drawing one bar per system (the demo's evaluation is tens of
    seconds: six systems on every set)."""
    bars: dict[str, tqdm[Any]] = {}

    def update(system: str, done: int, total: int) -> None:
        bar = bars.get(system)
        if bar is None or bar.total != total or done < bar.n:  # a new set starts
            if bar is not None:
                bar.close()
            bar = bars[system] = tqdm(total=total, desc=f"evaluate {system}", unit="q")
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def evaluate_stage(config: PipelineConfig, *, eval_path: str | Path, index_dir: str | Path,
                   policy_dir: str, sft_dir: str | None, out_dir: Path, rs_dir: str | None = None,
                   tracking_uri: str | None = None,
                   extra_sets: Mapping[str, str | Path] | None = None,
                   progress: Callable[[str, int, int], None] | None = None,
                   train_path: str | Path | None = None,
                   selection: Mapping[str, Any] | None = None,
                   searchers: SearcherProvider | None = None,
                   engine: RayEngine | None = None) -> EvalResult:
    """Evaluate the trained policy and the configured baselines on `eval_path` (searched in
    the main corpus), then on each extra eval set (name -> QA file, searched in the corpus
    indexed under `<index_dir>/<name>`, at most `eval.max_questions_per_set` questions),
    then audit sampled questions of the validated train split (`train_path`; default: the
    `train.jsonl` validation wrote beside `eval_path`) with the SFT policy. `selection`
    (`policy_selection`) says which checkpoint of the run `policy_dir` is.

    The champion baseline is looked up in the model registry of `tracking_uri` (skipped with
    a note when there is none, or no tracking store). With `engine`, the rollouts run on its
    workers (module docstring).
    """
    (out_dir / RESULTS_FILE).unlink(missing_ok=True)
    # A set dropped from the config must not linger among this evaluation's artifacts.
    shutil.rmtree(out_dir / SETS_DIR, ignore_errors=True)
    progress = progress or progress_bars()
    examples = read_qa(eval_path)
    if config.eval.max_questions is not None:
        examples = examples[: config.eval.max_questions]
    champion_dir: str | None = None
    if "champion" in config.eval.baselines and tracking_uri is not None:
        # Imported here: only the registry lookup needs mlflow, and the library stays
        # importable without it (tests/unit/test_architecture.py).
        from searchrl.tracking import download_registered_policy

        got = download_registered_policy(tracking_uri, config.registry_model_name,
                                         config.eval.champion_alias, out_dir / "champion")
        champion_dir = str(got) if got is not None else None
    systems, notes = plan_systems(config.eval.baselines, policy_dir=policy_dir,
                                  sft_dir=sft_dir, champion_dir=champion_dir, config=config,
                                  rs_dir=rs_dir)
    if train_path is None:
        train_path = Path(eval_path).with_name("train.jsonl")
    systems, notes = _with_train_split(systems, notes, train_path)
    searcher = (searchers or SearcherProvider(config.index)).searcher(index_dir)

    def remote_for(corpus: str) -> Remote | None:
        return (None if engine is None
                else Remote(engine, resolve_corpus(Path(index_dir), corpus)))

    main = _evaluate_systems(examples, systems, searcher, config, out_dir,
                             eval_set=f"{config.eval.split}:{Path(eval_path).name}",
                             notes=notes, progress=progress, remote=remote_for(MAIN_CORPUS))
    sets: dict[str, SetResult] = {}
    more: list[str] = []
    if extra_sets and config.index.mode == "service":
        more.append("extra eval sets are searched in-process over their own indexes (the "
                    "retrieval service serves the main corpus only)")
    for name, qa_path in extra_sets.items() if extra_sets else ():
        set_examples = read_qa(qa_path)
        if config.eval.max_questions_per_set is not None:
            set_examples = set_examples[: config.eval.max_questions_per_set]
        # Its own corpus: a question about another corpus's facts must not find them.
        set_searcher = load_corpus_searcher(resolve_corpus(Path(index_dir), name), config.index)
        set_dir = out_dir / SETS_DIR / safe_filename(name)
        # The split name validation (and so a steward override) gives an extra eval set.
        one = evaluate(set_examples, systems, set_searcher, config, set_dir,
                       eval_set=f"{name}:{Path(qa_path).name}", progress=progress,
                       audit_split=extra_eval_split(name), remote=remote_for(name))
        sets[name] = one.set_result(name, str(set_dir / RESULTS_FILE))
    train_audit = audit_train_split(config, train_path, sft_dir or policy_dir, searcher,
                                    out_dir, system="sft" if sft_dir else TRAINED,
                                    progress=progress, remote=remote_for(MAIN_CORPUS))
    result = dataclasses.replace(main, extra_sets=sets, notes=(*main.notes, *more),
                                 train_audit=train_audit,
                                 policy_selection=dict(selection or {}))
    write_results(result, out_dir)
    return result


def _with_train_split(systems: Sequence[SystemSpec], notes: Sequence[str],
                      train_path: str | Path) -> tuple[list[SystemSpec], list[str]]:
    """The scripted system reads its templates from the validated train split; without one
    it is skipped with a note."""
    out: list[SystemSpec] = []
    more = list(notes)
    for spec in systems:
        if spec.mode != "scripted":
            out.append(spec)
        elif Path(train_path).is_file():
            out.append(dataclasses.replace(spec, policy=str(train_path)))
        else:
            more.append(f"baseline scripted skipped: no train split at {train_path}")
    return out, more


def policy_selection(checkpoint: CheckpointRef) -> dict[str, Any]:
    """Which checkpoint of the training run the evaluated (and, on GO, registered) policy is:
    the best dev evaluation or the last step, with both steps and their dev metric."""
    return {"selection": checkpoint.selection, "metric": checkpoint.select_metric,
            "selected_step": checkpoint.selected_step,
            "selected_value": checkpoint.selected_value, "last_step": checkpoint.last_step,
            "last_value": checkpoint.last_value, "policy_dir": checkpoint.policy_dir,
            "last_policy_dir": checkpoint.last_policy_dir,
            "stopped_early": checkpoint.stopped_early}
