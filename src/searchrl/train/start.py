"""The policy GRPO starts from, prepared once by the train stage before any rank runs.

`train.init=base`: the cold start (`cold_start/build.py`, reused as is when the curriculum stage
made it with the same key). `train.init=champion`: the registry's champion, downloaded into
the stage dir; the cold start is then made only for the rejection-sampling comparator, which
fine-tunes it (and is reused from the curriculum stage when there is one).

The stage writes what it prepared to `start.json`; every rank reads it (`read_start`), the
in-process one and DeepSpeed's alike, and the comparator reuses the same cold start: nothing
downstream builds a start again.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from searchrl.config import PipelineConfig
from searchrl.datasets.io import atomic_write_text, read_passages, read_qa
from searchrl.refs import StageInputError
from searchrl.retrieval.base import Searcher
from searchrl.sinks import MetricsSink
from searchrl.train.cold_start.build import SFT_KEY_FILE, cold_start, cold_start_seconds
from searchrl.types import CurriculumRef, DatasetRef

SFT_DIR = "sft"  # under the stage dir: the cold start (the curriculum stage's, or made here)
CHAMPION_START = "champion_start"  # train.init=champion: the downloaded champion policy
START_FILE = "start.json"  # what the stage prepared, for the ranks


@dataclass(frozen=True)
class StartPolicy:
    """What the stage prepared: `policy_dir` GRPO starts from; `sft_dir` the policy evaluated
    as the `sft` system (the cold start, or under train.init=champion the champion when no
    cold start existed before the stage); `seconds` the cold start's time charged to
    training (as recorded when it was built; 0 for a champion); `cold_dir` the cold start
    (None under train.init=champion without the comparator)."""

    policy_dir: Path
    sft_dir: Path
    seconds: float
    cold_dir: Path | None

    def to_json(self, out_dir: Path) -> str:
        """The record, its dirs relative to the stage dir `out_dir` where they lie in it (a
        copy of the stage dir names its own start)."""
        def rel(v: object) -> object:
            if not isinstance(v, Path):
                return v
            return str(v.relative_to(out_dir)) if v.is_relative_to(out_dir) else str(v)
        return json.dumps({k: rel(v) for k, v in asdict(self).items()})


def prepare_start(config: PipelineConfig, dataset: DatasetRef, curriculum: CurriculumRef | None,
                  searcher: Searcher, out_dir: Path, sink: MetricsSink) -> StartPolicy:
    """The start policy, under `out_dir` (the stage dir), recorded in `out_dir/start.json`.

    The cold start is made from the validated train split and corpus (the curriculum stage's
    inputs, so its key matches and its cold start is reused); `searcher` is searched only
    when it must be built."""
    pointer = out_dir / START_FILE
    pointer.unlink(missing_ok=True)
    cold = out_dir / SFT_DIR
    champion = fetch_champion_start(config, out_dir, sink.tracking_uri)
    # The SFT baseline stays the cold start (the curriculum stage's) when RL starts from the
    # champion, which is evaluated as its own baseline; without one, the champion.
    evaluated = cold if champion is None or (cold / "config.json").is_file() else champion
    started = time.perf_counter()
    made: Path | None = None
    if champion is None or config.train.rejection_sampling.enabled:
        # GRPO's start, or the comparator's: under train.init=champion it fine-tunes the
        # curriculum stage's cold start as it is (vouched for by that stage's reference).
        reused = (champion is not None and curriculum is not None
                  and (cold / SFT_KEY_FILE).is_file())
        made = cold if reused else cold_start(
            config, read_qa(dataset.paths["train"]), read_passages(dataset.corpus_path),
            searcher, cold, sink)
    if champion is None:
        assert made is not None
        start = StartPolicy(made, made, cold_start_seconds(made, time.perf_counter() - started),
                            made)
    else:
        start = StartPolicy(champion, evaluated, 0.0, made)
    atomic_write_text(pointer, start.to_json(out_dir))
    return start


def read_start(out_dir: Path) -> StartPolicy:
    """The start the train stage prepared in `out_dir` (for a rank)."""
    pointer = out_dir / START_FILE
    if not pointer.is_file():
        raise StageInputError(f"{pointer} not found: a rank trains from the start policy the "
                              "train stage prepares; run `python -m searchrl train`, not a "
                              "rank alone")
    data = json.loads(pointer.read_text())
    cold = data["cold_dir"]
    return StartPolicy(out_dir / data["policy_dir"], out_dir / data["sft_dir"],
                       float(data["seconds"]), out_dir / cold if cold is not None else None)


def fetch_champion_start(config: PipelineConfig, out_dir: Path, tracking_uri: str | None
                         ) -> Path | None:
    """train.init=champion: download the registry's champion into `out_dir/champion_start`
    and record where in `champion_start.json`; None for init=base."""
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
    # The start's identity for resuming checkpoints (train/grpo/checkpoint.py run_identity).
    atomic_write_text(got / SFT_KEY_FILE, json.dumps({"champion": name, "version": version}))
    atomic_write_text(pointer, json.dumps({"dir": str(got), "model": name, "version": version}))
    return got
