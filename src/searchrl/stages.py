"""The six pipeline stages, each one library function with one signature:

    stage(config, *input_references, sink) -> output_reference

The Prefect tasks (`tasks/*.py`) and the CLI (`python -m searchrl <stage>`) call these and
nothing else, so both run exactly the same code and write the same files under
`run.work_dir`. A stage removes its `ref.json` first and writes it last: a stage directory
with a `ref.json` is complete, and the CLI reads a stage's inputs from its upstream stages'
`ref.json`. Every reference lists the files it stands for with their fingerprints, so a cached
reference is reused only while those files exist unchanged (`ref_is_current`), and a stage
reads only what its own upstream wrote: it checks its input references' files before it reads
them and again before it publishes (`check_inputs`), so a run whose inputs another run on the
same work dir replaced fails naming them instead of deciding on that run's numbers.

`STAGES` says, per stage, which inputs outside the references (data files, contract suites,
overrides, the registry's champion) its result depends on; the config values it depends on
are declared per field in `searchrl.config` (`config.inputs_of(stage)`); the cache key
(tasks/_common.py) adds the code the stage reaches (`searchrl.codehash`).

Over 400 lines because the six stage functions share one contract (the stage dir's lock, `ref.json`
removed first and written last, the files a reference vouches for, the inputs in `STAGES`) and
are read against it side by side; each stage's work lives in its own package (contracts/,
retrieval/, curriculum/, train/, eval/, gate/), only its wiring is here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import math
import tempfile
import time
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from searchrl.config import PipelineConfig
from searchrl.contracts.drift import history_dir, keep_digest
from searchrl.contracts.validate import QuarantineThresholdError
from searchrl.contracts.validate import validate_gold_labels as run_validation
from searchrl.curriculum.stage import run_curriculum
from searchrl.data.io import (
    DataError,
    atomic_write_text,
    fingerprint,
    publish_dir,
    read_passages,
    read_qa,
)
from searchrl.data.sources import source_fingerprint
from searchrl.engine import open_engine
from searchrl.eval.results import RESULTS_FILE, EvalResult, load_eval_result
from searchrl.eval.run import SETS_DIR, evaluate_stage, policy_selection
from searchrl.gate.report import count_rows, stage_costs, write_gate_report
from searchrl.locks import held
from searchrl.models.prior import is_bundled_prior, prior_fingerprint
from searchrl.paths import StagePaths
from searchrl.retrieval.index_store import MAIN_CORPUS, build_indexes
from searchrl.retrieval.provider import SearcherProvider, searchers_for
from searchrl.sinks import MetricsSink, NullSink
from searchrl.train.checkpoint import checkpoint_dir_lock
from searchrl.train.cold_start import SFT_KEY_FILE, cold_start
from searchrl.train.grpo import train_policy_run
from searchrl.train.launch import env_rank, launch_ranks
from searchrl.train.rejection import (
    RS_DIR,
    SAMPLES_FILE,
    RejectionSamplingResult,
    build_rejection_sampling,
    write_estimate_samples,
)
from searchrl.train.selection import choose_policy
from searchrl.types import (
    CheckpointRef,
    CurriculumRef,
    DatasetRef,
    Decision,
    EvalRef,
    IndexRef,
    StageRef,
)

REF_FILE = "ref.json"
R = TypeVar("R", bound=StageRef)


class StageInputError(RuntimeError):
    """A stage's input is missing or stale; names what to run first."""


class ReplacedInputError(StageInputError):
    """A file an input reference vouches for is no longer what its stage wrote for this run:
    another run on the same work dir (or a hand edit) replaced it since."""


# --- references on disk


def files_of(*paths: str | Path | None) -> dict[str, str]:
    """path -> content fingerprint, for a reference's `files`."""
    return {str(p): fingerprint(p) for p in paths if p is not None}


def ref_is_current(ref: object) -> bool:
    """True when every file the reference stands for exists with the recorded fingerprint."""
    files = getattr(ref, "files", None)
    return isinstance(files, dict) and bool(files) and next(_changed(ref), None) is None


def changed_files(ref: object) -> list[str]:
    """The files `ref` vouches for that are gone or hold other content than it recorded."""
    return list(_changed(ref))


def _changed(ref: object) -> Iterator[str]:
    """`ref`'s files that are gone, unreadable or hold other content, lazily (a cache check
    stops at the first)."""
    files = getattr(ref, "files", None)
    for path, fp in (files.items() if isinstance(files, dict) else ()):
        try:
            same = Path(path).exists() and fingerprint(path) == fp
        except (OSError, DataError):
            same = False
        if not same:
            yield path


def check_inputs(stage: str, *inputs: StageRef | None) -> None:
    """A run reads only its own results: every file the stage's input references vouch for
    must still be what their stages wrote for this run, else ReplacedInputError naming it.

    Stage dirs are shared by every run on a work dir (one layout, so the CLI, resume and
    retention find them); a run with other inputs rewrites them, e.g. between this run's
    evaluate and its gate. A stage calls this before it reads its inputs and again before
    its result becomes visible (its ref.json, a registration): a replacement while it ran is
    caught too. A reference without `files` (built by hand) vouches for nothing to check."""
    producer = {s.output_kind(): n for n, s in STAGES.items()}
    for ref in inputs:
        changed = changed_files(ref) if ref is not None else []
        if changed:
            made_by = producer.get(type(ref), "its stage")
            raise ReplacedInputError(
                f"{stage}: {', '.join(changed)} changed after {made_by} wrote it for this run "
                "(another run on this work dir replaced it, or it was edited); a stage reads "
                f"only what its own upstream wrote. Re-run the pipeline (the re-run recomputes "
                f"{made_by} and what follows it); give runs that may overlap their own "
                "run.work_dir")


# The layout of ref.json (its fields and what they mean): bump it when a reference type
# changes so that an older or newer file would be misread. A ref.json without the stamp was
# written before it, in layout 1. A layout this release does not read is a stage to re-run,
# never a guess (the Prefect cache needs no stamp: its key holds the code of searchrl.types).
REF_FORMAT = 1
READABLE_REF_FORMATS = frozenset({1})
_FORMAT_KEY = "format_version"


def write_ref(ref: StageRef, stage_dir: Path) -> None:
    atomic_write_text(stage_dir / REF_FILE, json.dumps(
        {_FORMAT_KEY: REF_FORMAT, **dataclasses.asdict(ref)}, indent=2))


def read_ref(kind: type[R], stage_dir: Path, stage_cli: str) -> R:
    """The reference a finished stage left in `stage_dir`, checked against the disk: a
    StageInputError naming the file and the stage to re-run when it is missing, stale, or
    written in a layout this release does not read."""
    path = stage_dir / REF_FILE
    if not path.is_file():
        raise StageInputError(f"{path} not found: run `python -m searchrl {stage_cli}` first")
    rerun = f"re-run `python -m searchrl {stage_cli}` (it recomputes the stage with this release)"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StageInputError(f"{path}: unreadable ({exc}); {rerun}") from exc
    stamp = data.pop(_FORMAT_KEY, 1) if isinstance(data, dict) else None
    if stamp not in READABLE_REF_FORMATS:
        raise StageInputError(f"{path}: reference format {stamp!r}, this release reads "
                              f"{sorted(READABLE_REF_FORMATS)}; {rerun}")
    try:
        if kind is Decision:
            data["reasons"] = tuple(data["reasons"])
        ref = kind(**data)
    except (TypeError, KeyError) as exc:  # fields added, renamed or removed since
        raise StageInputError(f"{path}: not a {kind.__name__} this release reads ({exc}); "
                              f"{rerun}") from exc
    if not ref_is_current(ref):
        raise StageInputError(f"{path}: the files it references changed or are gone; "
                              f"re-run `python -m searchrl {stage_cli}`")
    return ref


def _begin(stage_dir: Path) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / REF_FILE).unlink(missing_ok=True)


def _begin_fresh(stage_dir: Path) -> None:
    """An empty `stage_dir`: what an earlier run left (another config's systems, a champion,
    report files) is neither this run's output nor its artifact. The old directory goes in
    one exchange (`publish_dir` of an empty one); the stage then writes in place, as its
    results record their absolute paths, and its ref.json, written last, marks it complete."""
    stage_dir.parent.mkdir(parents=True, exist_ok=True)
    publish_dir(Path(tempfile.mkdtemp(prefix=f".{stage_dir.name}.new-", dir=stage_dir.parent)),
                stage_dir)


def stage_dir_lock(stage_dir: Path) -> contextlib.AbstractContextManager[Path]:
    """One run at a time in a stage dir: a stage clears or rewrites its dir (evaluate and gate
    replace it whole, validation drops its earlier outputs' manifests, the index build its
    temp dirs), so a concurrent manual run would wipe or mix this one's files (training holds
    its checkpoint dir's lock instead). BusyError naming the holder."""
    return held(stage_dir, busy=f"another run of this stage writes into {stage_dir} (and "
                                "clears or rewrites it)")


def _finish(ref: R, stage_dir: Path, inputs: tuple[StageRef | None, ...] = ()) -> R:
    """Write the stage's ref.json (its completion mark), once its inputs are checked again:
    a result computed while another run replaced them is not published."""
    check_inputs(stage_dir.name, *inputs)
    write_ref(ref, stage_dir)
    return ref


# --- 1. validate_gold_labels


def validate_gold_labels(config: PipelineConfig, sink: MetricsSink) -> DatasetRef:
    """Contracts, quarantine and audit report; the clean splits and corpora as a DatasetRef."""
    out_dir = StagePaths(config.run.work_dir).validate_dir
    with stage_dir_lock(out_dir):
        _begin(out_dir)
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
        return _finish(DatasetRef(
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
        _begin(stage_dir)
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
        return _finish(IndexRef(index_dir=str(stage_dir), fingerprint=combined,
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
        _begin(paths.curriculum_dir)
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
        return _finish(CurriculumRef(
            train_path=str(result.train_path), fingerprint=fingerprint(result.train_path),
            difficulty_path=str(result.difficulty_path), dropped_path=str(result.dropped_path),
            samples_path=str(samples), files=files_of(result.train_path, sft_dir, samples),
            seconds=time.perf_counter() - started, mlflow_run_id=sink.run_id),
            paths.curriculum_dir, (dataset, index))


# --- 4. train_policy


def train_policy(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                 curriculum: CurriculumRef | None, sink: MetricsSink, *,
                 searchers: SearcherProvider | None = None) -> CheckpointRef:
    """GRPO on the curriculum-ordered set (the validated train split without one).

    Writes under `<work_dir>/train_policy/`: sft/ (cold start), policy/ (final), best_policy/
    (train.keep_best), checkpoints/, metrics.jsonl, curve.png, and under
    train.rejection_sampling rejection_sampling/ (a comparator, built after GRPO, in this process:
    `_rejection_sampling`). A re-run after a crash resumes from the newest checkpoint. The
    reference's `policy_dir` is the selected policy (the best dev evaluation under
    train.keep_best, else the last step's); it records both.
    `train.launch.mode=inprocess` trains here as one rank (`run_training`); `deepspeed` starts
    the ranks through DeepSpeed's launcher (`train/launch.py`), each running `run_training`
    through the rank entry point (`python -m searchrl train-rank`), and reads the reference
    rank 0 wrote. Refused while another process trains into the same checkpoint dir.
    """
    started = time.perf_counter()
    out_dir = StagePaths(config.run.work_dir).train_dir
    if config.train.launch.mode == "inprocess":
        with checkpoint_dir_lock(out_dir / CHECKPOINTS):
            check_inputs("train_policy", dataset, index, curriculum)
            _begin(out_dir)
            fetch_champion_start(config, out_dir, sink.tracking_uri)
            ref = run_training(config, dataset, index, curriculum, sink, searchers=searchers)
            return _with_comparator(config, ref, dataset, index, curriculum, sink, searchers)
    with checkpoint_dir_lock(out_dir / CHECKPOINTS):  # fail before starting anything
        check_inputs("train_policy", dataset, index, curriculum)
        _begin(out_dir)
        fetch_champion_start(config, out_dir, sink.tracking_uri)
    # The ranks search through the flow's managed server (plain clients: no restarts there).
    searchers_for(config, searchers).ensure_service()
    launch_ranks(config, out_dir, mlflow_run_id=sink.run_id, tracking_uri=sink.tracking_uri)
    ranks_ref = read_ref(CheckpointRef, out_dir, "train")
    # the stage's wall time includes starting the ranks
    seconds = time.perf_counter() - started + ranks_ref.earlier_attempts_seconds
    ref = dataclasses.replace(ranks_ref, seconds=seconds)
    with checkpoint_dir_lock(out_dir / CHECKPOINTS):  # the ranks have let it go
        return _with_comparator(config, ref, dataset, index, curriculum, sink, searchers)


def _with_comparator(config: PipelineConfig, ref: CheckpointRef, dataset: DatasetRef,
                     index: IndexRef, curriculum: CurriculumRef | None, sink: MetricsSink,
                     searchers: SearcherProvider | None) -> CheckpointRef:
    """The stage's reference, with the rejection-sampling comparator (train.rejection_sampling)
    built after GRPO: in deepspeed mode its generator and fine-tuning never hold the stage's
    device while the ranks start, and its time is its own. Until it is built the stage is not
    complete: the reference the training wrote is withdrawn, and written again with it."""
    out_dir = StagePaths(config.run.work_dir).train_dir
    inputs = (dataset, index, curriculum)
    if not config.train.rejection_sampling.enabled:
        return _finish(ref, out_dir, inputs)
    _begin(out_dir)  # withdraws the training's ref.json until the comparator is built too
    rs = _rejection_sampling(config, dataset, index, curriculum, sink, searchers)
    return _finish(_with_rs(ref, rs), out_dir, inputs)


def _rejection_sampling(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                        curriculum: CurriculumRef | None, sink: MetricsSink,
                        searchers: SearcherProvider | None) -> RejectionSamplingResult:
    """The RS comparator under `train_policy/rejection_sampling`, built (or reused: its own
    key) on the stage's process, and its figures logged.

    Here rather than in the ranks: no rank waits on it, so its minutes at scale hold no
    collective, and its time is measured apart from GRPO's. It fine-tunes the cold start the
    curriculum stage made (vouched for by that stage's reference) and reuses its samples;
    without a curriculum stage it finds the cold start the trainer made (same key), or makes
    it by the one function that makes it (train.init=champion trains from the champion).
    """
    train_dir = StagePaths(config.run.work_dir).train_dir
    searcher = searchers_for(config, searchers).searcher(index.index_dir)
    sft_dir = train_dir / "sft"
    if curriculum is None or not (sft_dir / SFT_KEY_FILE).is_file():
        sft_dir = cold_start(config, read_qa(dataset.paths["train"]),
                             read_passages(dataset.corpus_path), searcher, sft_dir, sink)
    # The validated train split, in its own order: the curriculum estimated the first
    # `curriculum.max_questions` of it, so those samples are reused, and the questions every
    # sample got right (which the curriculum drops as zero-variance) are RS's best data.
    questions = read_qa(dataset.paths["train"])
    samples = curriculum.samples_path if curriculum is not None else None
    result = build_rejection_sampling(config, questions, sft_dir, searcher, train_dir / RS_DIR,
                                      samples_path=Path(samples) if samples else None,
                                      sink=sink)
    sink.log_metrics(result.metrics | {"rs_seconds": result.seconds,
                                       "rs_reused_policy": float(not result.built)})
    return result


def _with_rs(ref: CheckpointRef, rs: RejectionSamplingResult) -> CheckpointRef:
    """The training reference with the RS policy: evaluated beside it, its files vouched for."""
    return dataclasses.replace(ref, rs_dir=str(rs.policy_dir), rs_seconds=rs.seconds,
                               files=ref.files | files_of(rs.policy_dir))


CHECKPOINTS = "checkpoints"  # under the stage dir (grpo's TrainState.checkpoints)
CHAMPION_START = "champion_start"  # train.init=champion: the downloaded champion policy


def fetch_champion_start(config: PipelineConfig, out_dir: Path, tracking_uri: str | None
                         ) -> Path | None:
    """train.init=champion: download the registry's champion into `out_dir/champion_start`
    (before any rank starts) and record where in `champion_start.json`; None for init=base."""
    import shutil

    from searchrl.tracking import download_policy_version, registered_policy, resolve_tracking_uri

    pointer = out_dir / f"{CHAMPION_START}.json"
    pointer.unlink(missing_ok=True)
    if config.train.init != "champion":
        return None
    uri = tracking_uri or resolve_tracking_uri(config.tracking.tracking_uri)
    name, alias = config.registry_model_name, config.eval.champion_alias
    shutil.rmtree(out_dir / CHAMPION_START, ignore_errors=True)
    # One lookup: the version recorded is the one downloaded, even if the alias moves.
    found = registered_policy(uri, name, alias)
    if found is None:
        raise StageInputError(
            f"train.init=champion but {uri} has no {name}@{alias}: register a champion first "
            "(a GO of the gate stage), or set train.init=base")
    got = download_policy_version(uri, name, found, out_dir / CHAMPION_START)
    version = found["version"]
    # The start's identity for resuming checkpoints (train/checkpoint.py run_identity).
    atomic_write_text(got / SFT_KEY_FILE, json.dumps({"champion": name, "version": version}))
    atomic_write_text(pointer, json.dumps({"dir": str(got), "model": name, "version": version}))
    return got


def champion_start(config: PipelineConfig, out_dir: Path) -> Path | None:
    """The champion policy `fetch_champion_start` downloaded (None for train.init=base)."""
    if config.train.init != "champion":
        return None
    pointer = out_dir / f"{CHAMPION_START}.json"
    if not pointer.is_file():
        raise StageInputError(f"{pointer} not found: train.init=champion starts from the "
                              "champion the train stage downloads; run `python -m searchrl "
                              "train`, not a rank alone")
    return Path(json.loads(pointer.read_text())["dir"])


def run_training(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                 curriculum: CurriculumRef | None, sink: MetricsSink, *,
                 searchers: SearcherProvider | None = None) -> CheckpointRef:
    """One rank's training (`$RANK`, 0 without a launcher): the in-process stage and every
    launched rank run this. Rank 0 holds the checkpoint dir's lock, logs to `sink` and writes
    the stage's reference; the other ranks log nothing and return theirs unwritten."""
    started = time.perf_counter()
    out_dir = StagePaths(config.run.work_dir).train_dir
    lead = env_rank() == 0
    with checkpoint_dir_lock(out_dir / CHECKPOINTS) if lead else contextlib.nullcontext():
        return _train_rank(config, dataset, index, curriculum,
                           sink if lead else NullSink(), lead=lead, started=started,
                           searchers=searchers_for(config, searchers))


def _train_rank(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                curriculum: CurriculumRef | None, sink: MetricsSink, *, lead: bool,
                started: float, searchers: SearcherProvider) -> CheckpointRef:
    out_dir = StagePaths(config.run.work_dir).train_dir
    launch = config.train.launch
    train_path = Path(curriculum.train_path if curriculum else dataset.paths["train"])
    sink.set_tags({"data.train": fingerprint(train_path), "index": index.fingerprint})
    start = champion_start(config, out_dir)  # refused before a searcher is started
    searcher = searchers.searcher(index.index_dir)
    dev = dataset.paths.get("dev")
    result = train_policy_run(config, train_path, Path(dataset.corpus_path), searcher,
                              out_dir, sft_train_path=Path(dataset.paths["train"]),
                              dev_path=Path(dev) if dev else None, sink=sink, init_dir=start)
    choice = choose_policy(result, config.train)
    # The SFT baselines stay the cold start (the curriculum stage's) when RL started from
    # the champion, which is evaluated as its own baseline.
    cold = out_dir / "sft"
    sft_dir = cold if start is not None and (cold / "config.json").is_file() else result.sft_dir
    sink.set_tags({"train.init": config.train.init}
                  | ({"train.init_dir": str(start)} if start is not None else {}))
    ref = CheckpointRef(
        policy_dir=str(choice.policy_dir), fingerprint=fingerprint(choice.policy_dir),
        sft_dir=str(sft_dir), metrics_path=str(result.metrics_path),
        training_seconds=result.seconds + result.sft_seconds,
        # A resumed run costs its earlier attempts too (up to the checkpoint resumed from).
        seconds=time.perf_counter() - started + result.earlier_attempts_seconds,
        earlier_attempts_seconds=result.earlier_attempts_seconds,
        devices=launch.ranks * launch.nodes,
        # The cold start too: evaluation measures it as the `sft` system.
        files=files_of(choice.policy_dir, result.policy_dir, result.metrics_path, sft_dir),
        mlflow_run_id=sink.run_id, selection=choice.selection,
        selected_step=choice.selected_step, last_policy_dir=str(result.policy_dir),
        last_step=choice.last_step, select_metric=choice.metric,
        selected_value=choice.selected_value, last_value=choice.last_value,
        stopped_early=result.stopped_early)
    if not lead:
        return ref
    sink.log_metrics({"training_seconds": result.seconds, "sft_seconds": result.sft_seconds,
                      "earlier_attempts_seconds": result.earlier_attempts_seconds,
                      "skipped_steps": result.skipped_steps, "steps": result.steps_done,
                      "selected_step": choice.selected_step})
    sink.set_tags({"policy.selection": choice.selection})
    sink.log_artifact(result.metrics_path, "training")
    if result.curve_path is not None:
        sink.log_artifact(result.curve_path, "training")
    if sink.tracking_uri is not None and sink.run_id is not None:
        from searchrl.tracking import log_policy_model

        # Stored once, as the MLflow model the gate registers (never logged again there).
        log_policy_model(sink.tracking_uri, sink.run_id, choice.policy_dir)
    return _finish(ref, out_dir, (dataset, index, curriculum))


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
        _begin_fresh(out_dir)
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
        return _finish(EvalRef(results_path=str(results_path),
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


def decide_go_no_go(config: PipelineConfig, dataset: DatasetRef, checkpoint: CheckpointRef,
                    evaluation: EvalRef, sink: MetricsSink) -> Decision:
    """Cost-payback gate and report; on GO the policy is registered in the sink's store.

    Compute is charged per stage (wall time x devices): curriculum (read from its ref.json:
    the gate's inputs do not include it), training and evaluation."""
    paths = StagePaths(config.run.work_dir)
    out_dir = paths.gate_dir
    with stage_dir_lock(out_dir):
        check_inputs("decide_go_no_go", dataset, checkpoint, evaluation)
        _begin_fresh(out_dir)
        sink.log_params(config.to_dict()["gate"])
        costs, notes = stage_costs(_curriculum_record(paths), checkpoint, evaluation)
        evaluated = load_eval_result(evaluation.results_path)
        refuse_search_failures(evaluated, evaluation.results_path)
        tracked = sink.tracking_uri is not None and sink.run_id is not None
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
        check_inputs("decide_go_no_go", dataset, checkpoint, evaluation)
        result = outcome.result
        sink.set_tags({"decision": result.label}
                      | ({"promotion_blocked": plan.blocked[:5000]} if plan.blocked else {}))
        sink.log_metrics({k: v for k, v in outcome.figures.items() if math.isfinite(v)})
        sink.log_artifact(out_dir, "report")
        if tracked:
            sink.set_tags(_register_candidate(config, dataset, checkpoint, evaluation,
                                              outcome.figures, go=result.go, sink=sink,
                                              plan=plan))
        if (result.go and plan.blocked is None and dataset.digest_dir
                and Path(dataset.digest_dir).is_dir()):
            # The champion's gold set: what the next validation's drift is measured against.
            keep_digest(Path(dataset.digest_dir), history_dir(config.run.work_dir) / "champion")
        return _finish(Decision(
            go=result.go, reasons=result.reasons, report_html=str(outcome.html_path),
            report_md=str(outcome.md_path), figures=outcome.figures,
            files=files_of(outcome.html_path, outcome.md_path, outcome.decision_path),
            mlflow_run_id=sink.run_id), out_dir)


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


def _curriculum_record(paths: StagePaths) -> CurriculumRef | None:
    """The curriculum stage's reference; None when missing, stale or unreadable."""
    try:
        return read_ref(CurriculumRef, paths.curriculum_dir, "curriculum")
    except (StageInputError, ValueError, TypeError):
        return None


def _curriculum_cost(config: PipelineConfig) -> str:
    """The curriculum stage's recorded time is a gate input outside its references."""
    path = StagePaths(config.run.work_dir).curriculum_dir / REF_FILE
    try:
        data = json.loads(path.read_text())
        return f"curriculum:{data.get('seconds')}x{data.get('devices')}"
    except (OSError, ValueError, AttributeError):
        return "curriculum:none"


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
    Stage("decide_go_no_go", decide_go_no_go, _curriculum_cost),
)}
