"""The train stage (stage 4 of `stages.py`), top down:

    read inputs -> searcher -> start policy -> train (this process as the one rank, or the
    ranks through DeepSpeed's launcher) -> comparator -> finish

Writes under `<work_dir>/train_policy/`: sft/ (the cold start), start.json (the start the
ranks read), policy/ (final), best_policy/ (train.keep_best), checkpoints/, metrics.jsonl,
curve.png, and under train.rejection_sampling rejection_sampling/ (a comparator, built after
GRPO in the stage's process). A re-run after a crash resumes from the newest checkpoint. The
reference's `policy_dir` is the selected policy (the best dev evaluation under
train.keep_best, else the last step's); it records both.

The start policy is prepared once, before any rank runs (`start.py`): every rank, the
in-process one and those DeepSpeed's launcher starts (`python -m searchrl train-rank`,
`launched_rank`), trains from what it recorded, and the comparator fine-tunes the same cold
start. Rank 0 holds the checkpoint dir's lock, logs and writes the reference; the stage adds
the comparator and writes it again, complete. Refused while another process trains into the
same checkpoint dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from searchrl.config import PipelineConfig
from searchrl.datasets.io import fingerprint, read_qa
from searchrl.paths import StagePaths
from searchrl.refs import begin, check_inputs, files_of, finish, read_ref
from searchrl.retrieval.base import Searcher
from searchrl.retrieval.provider import SearcherProvider, searchers_for
from searchrl.sinks import MetricsSink, NullSink
from searchrl.train.distributed.launcher import env_rank, launch_ranks
from searchrl.train.grpo.checkpoint import checkpoint_dir_lock
from searchrl.train.grpo.selection import choose_policy
from searchrl.train.grpo.trainer import train_policy_run
from searchrl.train.rejection_sampling import RS_DIR, build_rejection_sampling
from searchrl.train.start import StartPolicy, prepare_start, read_start
from searchrl.types import CheckpointRef, CurriculumRef, DatasetRef, IndexRef, SearchHit

CHECKPOINTS = "checkpoints"  # under the stage dir (grpo's TrainState.checkpoints)


def train_policy(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                 curriculum: CurriculumRef | None, sink: MetricsSink, *,
                 searchers: SearcherProvider | None = None) -> CheckpointRef:
    """GRPO on the curriculum-ordered set (the validated train split without one), from the
    start policy prepared here; `train.launch.mode=inprocess` trains in this process as the
    one rank, `deepspeed` through DeepSpeed's launcher (`train/distributed/launcher.py`)."""
    started = time.perf_counter()
    out_dir = StagePaths(config.run.work_dir).train_dir
    inputs = (dataset, index, curriculum)
    provider = searchers_for(config, searchers)
    with contextlib.ExitStack() as held:
        held.enter_context(checkpoint_dir_lock(out_dir / CHECKPOINTS))
        # --- read inputs
        check_inputs("train_policy", *inputs)
        begin(out_dir)
        # --- searcher: opened on its first search (a current cold start never searches)
        searcher = _OnFirstSearch(lambda: provider.searcher(index.index_dir))
        # --- start policy: once, before any rank
        start = prepare_start(config, dataset, curriculum, searcher, out_dir, sink)
        # --- train: this process as the one rank, or the ranks through DeepSpeed's launcher
        if config.train.launch.mode == "inprocess":
            ref = train_rank(config, dataset, index, curriculum, start, searcher, sink,
                             started=started)
        else:
            held.close()  # rank 0 takes the checkpoint dir's lock
            ref = launch(config, provider, out_dir, sink, started=started)
            held.enter_context(checkpoint_dir_lock(out_dir / CHECKPOINTS))
        # --- comparator, then finish: the reference, complete
        return finish(comparator(config, ref, dataset, curriculum, start, searcher, out_dir,
                                 sink), out_dir, inputs)


class _OnFirstSearch:
    """A Searcher opened by its first search: the stage hands one to the cold start, which
    searches only when it builds, so a stage whose start is current (and whose ranks run
    elsewhere) loads no index and starts no server before the ranks need it."""

    def __init__(self, open_searcher: Callable[[], Searcher]) -> None:
        self._open = open_searcher
        self._searcher: Searcher | None = None

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        if self._searcher is None:
            self._searcher = self._open()
        return self._searcher.search_batch(queries, top_k)


# --- train: the ranks through DeepSpeed's launcher, or one rank


def launch(config: PipelineConfig, provider: SearcherProvider, out_dir: Path, sink: MetricsSink,
           *, started: float) -> CheckpointRef:
    """Start the ranks through DeepSpeed's launcher and read the reference rank 0 wrote;
    its time is the stage's (starting the ranks included). The ranks search through the
    flow's managed server (plain clients: no restarts there)."""
    provider.ensure_service()
    launch_ranks(config, out_dir, mlflow_run_id=sink.run_id, tracking_uri=sink.tracking_uri)
    ranks_ref = read_ref(CheckpointRef, out_dir, "train")
    return dataclasses.replace(ranks_ref, seconds=time.perf_counter() - started
                               + ranks_ref.earlier_attempts_seconds)


def launched_rank(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                  curriculum: CurriculumRef | None, sink: MetricsSink) -> CheckpointRef:
    """A rank DeepSpeed's launcher started (`python -m searchrl train-rank`): the start
    the stage prepared (refused before a searcher is opened when there is none), its own
    searcher, then `train_rank`."""
    started = time.perf_counter()
    start = read_start(StagePaths(config.run.work_dir).train_dir)
    searcher = searchers_for(config, None).searcher(index.index_dir)
    return train_rank(config, dataset, index, curriculum, start, searcher, sink, started=started)


def train_rank(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
               curriculum: CurriculumRef | None, start: StartPolicy, searcher: Searcher,
               sink: MetricsSink, *, started: float) -> CheckpointRef:
    """One rank's training (`$RANK`, 0 without a launcher) from `start`. Rank 0 holds the
    checkpoint dir's lock, logs to `sink` and writes the stage's reference (without the
    comparator); the other ranks log nothing and return theirs unwritten."""
    out_dir = StagePaths(config.run.work_dir).train_dir
    lead = env_rank() == 0
    sink = sink if lead else NullSink()
    train_path = Path(curriculum.train_path if curriculum else dataset.paths["train"])
    with checkpoint_dir_lock(out_dir / CHECKPOINTS) if lead else contextlib.nullcontext():
        sink.set_tags({"data.train": fingerprint(train_path), "index": index.fingerprint})
        dev = dataset.paths.get("dev")
        result = train_policy_run(config, train_path, Path(dataset.corpus_path), searcher,
                                  start.policy_dir, out_dir, init_seconds=start.seconds,
                                  dev_path=Path(dev) if dev else None, sink=sink)
        choice = choose_policy(result, config.train)
        champion = config.train.init == "champion"
        sink.set_tags({"train.init": config.train.init}
                      | ({"train.init_dir": str(start.policy_dir)} if champion else {}))
        launch = config.train.launch
        ref = CheckpointRef(
            policy_dir=str(choice.policy_dir), fingerprint=fingerprint(choice.policy_dir),
            sft_dir=str(start.sft_dir), metrics_path=str(result.metrics_path),
            training_seconds=result.seconds + result.sft_seconds,
            # A resumed run costs its earlier attempts too (up to the checkpoint resumed from).
            seconds=time.perf_counter() - started + result.earlier_attempts_seconds,
            earlier_attempts_seconds=result.earlier_attempts_seconds,
            devices=launch.ranks * launch.nodes,
            # The cold start too: evaluation measures it as the `sft` system.
            files=files_of(choice.policy_dir, result.policy_dir, result.metrics_path,
                           start.sft_dir),
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
        return finish(ref, out_dir, (dataset, index, curriculum))


# --- comparator


def comparator(config: PipelineConfig, ref: CheckpointRef, dataset: DatasetRef,
               curriculum: CurriculumRef | None, start: StartPolicy, searcher: Searcher,
               out_dir: Path, sink: MetricsSink) -> CheckpointRef:
    """`ref` with the rejection-sampling comparator (train.rejection_sampling) under
    `rejection_sampling/`, built (or reused: its own key) here, after GRPO, and its figures
    logged; `ref` unchanged without it.

    In the stage's process rather than the ranks: no rank waits on it, so its minutes at
    scale hold no collective, its generator and fine-tuning never hold the device while the
    ranks start, and its time is its own. Until it is built the stage is not complete: the
    reference the training wrote is withdrawn, and written again with it. It fine-tunes the
    cold start the stage prepared and reuses the curriculum estimate's samples."""
    if not config.train.rejection_sampling.enabled:
        return ref
    assert start.cold_dir is not None  # prepare_start makes it for the comparator
    begin(out_dir)  # withdraws the training's ref.json until the comparator is built too
    # The validated train split, in its own order: the curriculum estimated the first
    # `curriculum.max_questions` of it, so those samples are reused, and the questions every
    # sample got right (which the curriculum drops as zero-variance) are RS's best data.
    questions = read_qa(dataset.paths["train"])
    samples = curriculum.samples_path if curriculum is not None else None
    rs = build_rejection_sampling(config, questions, start.cold_dir, searcher, out_dir / RS_DIR,
                                  samples_path=Path(samples) if samples else None, sink=sink)
    sink.log_metrics(rs.metrics | {"rs_seconds": rs.seconds,
                                   "rs_reused_policy": float(not rs.built)})
    # The RS policy is evaluated beside the trained one: its files vouched for too.
    return dataclasses.replace(ref, rs_dir=str(rs.policy_dir), rs_seconds=rs.seconds,
                               files=ref.files | files_of(rs.policy_dir))
