"""Retention: what a weekly pipeline deletes so its disk plateaus, and what it never deletes.

`plan_prune` lists every deletion `retention:` (searchrl/config/retention.py) asks for, with
its bytes and why; `apply_prune` carries a plan out; `prune` does both holding the work dir's
training lock. The flow prunes at the end of every run (flows/pipeline.py) and
`python -m searchrl prune [--dry-run]` by hand.

What is deleted:
- registered model versions beyond the aliased ones, the newest `keep_challengers` and the
  pinned ones (the registry entry and its logged policy);
- this pipeline's MLflow parent runs ("weeks": named `run.name`; the experiment is shared by
  every pipeline) beyond the newest `keep_weeks`, with their stage runs: marked deleted, then
  purged with `mlflow gc` where the store is local (its own retention);
- superseded training runs in the work dir beyond the newest `keep_weeks`, and in the kept
  ones every checkpoint but the newest `checkpoints_per_run` that verify; half-written
  `.step_*.tmp` checkpoints (while no training runs in the work dir);
- embedding-cache shards beyond `embedding_cache_max_bytes`, least recently used first
  (while no index build holds the index stage dir's lock);
- Prefect result records past their own expiration (the stage cache's `cache_expiration`).

Never deleted: a version an alias points at (champion, previous-champion, challenger: what
evaluation and a rollback read), the runs holding the policy of any registered version that
stays (another model's included), another pipeline's runs, a pinned run (parent or stage) or
version, a RUNNING MLflow run (until `running_stale_hours`: a SIGKILLed run never finishes),
and anything in the work dir while a run is in flight there (the training lock is held by
another process, or a run is RUNNING in the experiment). A registry that does not answer
prunes nothing (TrackingError).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

from searchrl.config import PipelineConfig
from searchrl.locks import BusyError, held
from searchrl.paths import StagePaths

SUPERSEDED_GLOB = "checkpoints.superseded-*"
CHECKPOINTS = "checkpoints"  # train.stage.CHECKPOINTS (not imported: it pulls in torch)
EMBEDDING_CACHE = "embedding_cache"
PINNED_TAG = "pinned"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deletion:
    kind: str  # model version | mlflow run | superseded run | checkpoint | embedding shard | ...
    target: str  # a path, `name vN`, or an MLflow run id
    bytes: int
    why: str
    paths: tuple[str, ...] = ()  # local files or directories removed with it


@dataclass
class PrunePlan:
    deletions: list[Deletion] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # protected, and why
    skipped: list[str] = field(default_factory=list)  # parts not pruned, and why

    @property
    def bytes(self) -> int:
        return sum(d.bytes for d in self.deletions)

    def summary(self, dry_run: bool) -> str:
        verb = "would delete" if dry_run else "deleted"
        lines = [f"{verb} {d.kind} {d.target} ({_size(d.bytes)}): {d.why}"
                 for d in self.deletions]
        lines += [f"kept {k}" for k in self.kept] + [f"skipped {s}" for s in self.skipped]
        lines.append(f"retention: {verb} {len(self.deletions)} items, {_size(self.bytes)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {"bytes": self.bytes, "deletions": [vars(d) for d in self.deletions],
                "kept": self.kept, "skipped": self.skipped}


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def disk_bytes(path: Path) -> int:
    """Bytes of the files under `path` (a file's own size; 0 when absent)."""
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def local_path(uri: str) -> Path | None:
    """The local directory of a `file:` URI (or a plain path), else None."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path))
    return None


# --- the work dir: superseded training runs and the embedding cache


def _superseded(config: PipelineConfig) -> list[Deletion]:
    """Superseded training runs beyond the newest `keep_weeks`; in the kept ones, every step
    but the newest `checkpoints_per_run` that verify (manifest and checksums: a newer corrupt
    one is no keeper), and every half-written `.step_*.tmp` (no training writes into a
    superseded run). Only called with no training in flight in the work dir."""
    from searchrl.train.grpo.checkpoint import STEP_PREFIX, CheckpointError, verify_checkpoint

    train_dir = StagePaths(config.run.work_dir).train_dir
    runs = sorted((p for p in train_dir.glob(SUPERSEDED_GLOB) if p.is_dir()),
                  key=lambda p: p.name, reverse=True)  # the suffix is a timestamp
    keep = config.retention.keep_weeks
    out = [Deletion("superseded run", str(p), disk_bytes(p),
                    f"older than the newest {keep} superseded training runs", (str(p),))
           for p in runs[keep:]]
    per_run = config.retention.checkpoints_per_run
    for run in runs[:keep]:
        steps = sorted((p for p in run.glob(f"{STEP_PREFIX}*") if p.is_dir()), reverse=True)
        if len(steps) <= per_run:
            continue  # nothing to choose between: no need to read them
        kept = 0
        for step in steps:  # newest first
            if kept < per_run:
                try:
                    verify_checkpoint(step)
                    kept += 1
                    continue
                except CheckpointError as exc:
                    why = f"fails verification ({exc})"
            else:
                why = f"{run.name} keeps its newest {per_run} verified"
            out.append(Deletion("checkpoint", str(step), disk_bytes(step), why, (str(step),)))
    # Half-written checkpoints: of a superseded run, or of a live dir nobody trains in now.
    for tmp in sorted(train_dir.glob(f"{CHECKPOINTS}*/.{STEP_PREFIX}*.tmp")):
        out.append(Deletion("checkpoint", str(tmp), disk_bytes(tmp),
                            "half-written (.tmp) by a training run that no longer runs",
                            (str(tmp),)))
    return out


def _embedding_shards(config: PipelineConfig) -> list[Deletion]:
    cap = config.retention.embedding_cache_max_bytes
    root = StagePaths(config.run.work_dir).index_dir / EMBEDDING_CACHE
    if cap is None or not root.is_dir():
        return []
    shards = []  # (last used, hashes file, vectors file, bytes)
    for hashes in root.glob("*/shard-*.hashes.npy"):
        vectors = hashes.with_name(hashes.name.removesuffix(".hashes.npy") + ".vectors.npy")
        size = disk_bytes(hashes) + disk_bytes(vectors)
        shards.append((hashes.stat().st_mtime, hashes, vectors, size))
    total = disk_bytes(root)
    out = []
    for _, hashes, vectors, size in sorted(shards, key=lambda s: (s[0], s[1].name)):
        if total <= cap:
            break
        total -= size
        out.append(Deletion("embedding shard", str(hashes.with_name(
            hashes.name.removesuffix(".hashes.npy"))), size,
            f"cache over {_size(cap)}: least recently used first",
            (str(hashes), str(vectors))))  # the hashes file first: a shard without it is
        # invisible to the cache, so a half-removed shard is never read
    return out


def _live(run: dict[str, object], stale_hours: float, now_ms: float) -> bool:
    """RUNNING and started within `stale_hours`: an older RUNNING run is one that never
    finished (SIGKILL, a lost machine) and protects nothing."""
    started = float(run["start_time"] or 0)  # type: ignore[arg-type]
    return run["status"] == "RUNNING" and now_ms - started < stale_hours * 3600e3


def _in_flight_work_dir(runs: list[dict[str, object]], stale_hours: float) -> str | None:
    now = time.time() * 1000
    for run in runs:
        if _live(run, stale_hours, now):
            return f"MLflow run {run['run_id']} is RUNNING"
    return None


# --- MLflow: registered versions and runs


def _mlflow_plan(config: PipelineConfig, uri: str, plan: PrunePlan
                 ) -> list[dict[str, object]]:
    """Add the registry's and this pipeline's weeks' deletions to `plan`; return the
    experiment's runs (for the in-flight check).

    The experiment is shared by every `run.name` (tracking.experiment), so only this
    pipeline's weeks (parent runs named `run.name`) are candidates, and a run whose artifacts
    back any registered version that stays (another model's included) is never deleted."""
    from searchrl.tracking import experiment_runs, registry_snapshot

    pinned = {p.removeprefix("v") for p in config.retention.pinned}
    protected_runs: dict[str, str] = {}  # run id -> why
    name = config.registry_model_name
    registered = registry_snapshot(uri)  # TrackingError when it does not answer: prune nothing
    newest = [mv for mv in registered if mv["name"] == name]
    recent = {v["version"] for v in newest[:config.retention.keep_challengers]}
    # Another model's versions are not this pipeline's to delete: they all stay.
    kept = [mv for mv in registered if mv["name"] != name]
    dropped = []
    for mv in newest:
        version = mv["version"]
        why = ([f"alias {a}" for a in mv["aliases"]]
               + (["pinned"] if version in pinned
                  or str(mv["tags"].get(PINNED_TAG, "")).lower() == "true" else [])
               + ([f"one of the newest {config.retention.keep_challengers}"]
                  if version in recent else []))
        if why:
            plan.kept.append(f"model version {name} v{version} ({', '.join(why)})")
            kept.append(mv)
        else:
            dropped.append(mv)
    for mv in kept:
        if mv["run_id"]:
            protected_runs.setdefault(str(mv["run_id"]), f"holds {mv['name']} v{mv['version']}")
    # A kept version's artifact is never deleted with another.
    kept_sources = [str(mv["source"]).rstrip("/") for mv in kept]
    for mv in dropped:
        source = local_path(mv["source"])
        shared = any(mv["source"].rstrip("/") == k for k in kept_sources)
        gone = source if source is not None and source.exists() and not shared else None
        plan.deletions.append(Deletion(
            "model version", f"{name} v{mv['version']}", disk_bytes(gone) if gone else 0,
            "no alias, not pinned, older than the newest "
            f"{config.retention.keep_challengers}", (str(gone),) if gone else ()))
    runs = experiment_runs(uri, config.tracking.experiment)
    by_parent: dict[str, list[dict[str, object]]] = {}
    for run in runs:
        if run["parent"]:
            by_parent.setdefault(str(run["parent"]), []).append(run)
    # The run whose artifacts hold a kept version's policy (the training run's, where the
    # gate registered that one), then a protected stage run's whole week.
    for run in runs:
        root = str(run["artifacts"]).rstrip("/") + "/"
        holder = next((k for k in kept_sources if k.startswith(root)), None)
        if holder is not None:
            protected_runs.setdefault(str(run["run_id"]), f"holds the policy {holder}")
    for run in runs:
        if run["run_id"] in protected_runs and run["parent"]:
            protected_runs.setdefault(str(run["parent"]), protected_runs[str(run["run_id"])])
    parents = [r for r in runs if not r["parent"] and r["name"] == config.run.name]
    keep = config.retention.keep_weeks
    now = time.time() * 1000
    stale_hours = config.retention.running_stale_hours
    for n, parent in enumerate(parents):
        rid = str(parent["run_id"])
        week = [parent, *by_parent.get(rid, [])]
        reasons = ([f"one of the newest {keep} runs"] if n < keep else []) \
            + (["pinned"] if any(str(r["run_id"]) in pinned for r in week) else []) \
            + ([protected_runs[rid]] if rid in protected_runs else []) \
            + (["RUNNING"] if any(_live(r, stale_hours, now) for r in week) else [])
        if reasons:
            if n >= keep:
                plan.kept.append(f"MLflow run {rid} ({', '.join(reasons)})")
            continue
        for run in week:
            artifacts = local_path(str(run["artifacts"]))
            size = disk_bytes(artifacts) if artifacts is not None else 0
            size -= sum(d.bytes for d in plan.deletions if d.kind == "model version"
                        and any(p.startswith(str(artifacts) + "/") for p in d.paths)
                        ) if artifacts is not None else 0  # counted with its version
            plan.deletions.append(Deletion(
                "mlflow run", str(run["run_id"]), size,
                f"week older than the newest {keep}" + (" (stage run)" if run["parent"]
                                                        else " (parent run)")))
    return runs


def _gc_runs(uri: str, run_ids: list[str]) -> None:
    """Purge deleted runs (their rows and artifacts) from a local store with `mlflow gc`,
    MLflow's own retention; a tracking server purges on its own schedule."""
    if not run_ids or not uri.startswith("sqlite:"):
        return
    import subprocess
    import sys

    # Its own process: `mlflow gc` sets the process-wide tracking URI.
    done = subprocess.run([sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", uri,
                           "--tracking-uri", uri, "--run-ids", ",".join(run_ids)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"mlflow gc --backend-store-uri {uri} failed (the runs stay marked "
                           f"deleted; `mlflow gc` purges them later): {done.stderr[-2000:]}")


# --- Prefect's result records


def _expired_results(storage: Path | None, plan: PrunePlan) -> list[Deletion]:
    """The result records past their `metadata.expiration`. A record whose expiration is not
    an ISO time with a zone (naive, a number, garbage) is skipped with a warning naming it:
    one odd record must never stop retention of the rest."""
    if storage is None or not storage.is_dir():
        return []
    now = datetime.now(UTC)
    out = []
    for record in storage.iterdir():
        if not record.is_file():
            continue
        try:
            expiration = json.loads(record.read_text())["metadata"].get("expiration")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a result record Prefect wrote: not ours to judge
        if expiration is None:
            continue  # never expires
        try:
            when = datetime.fromisoformat(expiration) if isinstance(expiration, str) else None
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            why = (f"prefect result {record}: expiration {expiration!r} is not an ISO time with "
                   "a zone (as Prefect writes it); left alone, delete it by hand if stale")
            log.warning("retention: %s", why)
            plan.skipped.append(why)
            continue
        if when < now:
            out.append(Deletion("prefect result", str(record), disk_bytes(record),
                                f"expired {expiration}", (str(record),)))
    return out


def prefect_result_storage() -> Path:
    """Where Prefect keeps result records here (its settings: env, profile or default). Asked of
    Prefect in a child process: the library never imports prefect (docs/DESIGN.md)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "from prefect.settings import get_current_settings; "
         "print(get_current_settings().results.local_storage_path)"],
        capture_output=True, text=True, timeout=120, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


# --- plan, apply


def plan_prune(config: PipelineConfig, uri: str | None, *,
               prefect_storage: Path | None = None, work_dir_in_flight: str | None = None,
               index_in_flight: str | None = None) -> PrunePlan:
    """What retention would delete now (nothing is touched). `work_dir_in_flight` /
    `index_in_flight`: why the work dir / the index stage dir is busy (`prune` holds their
    locks, or says who does); their files are then left alone."""
    plan = PrunePlan()
    runs = _mlflow_plan(config, uri, plan) if uri else []
    in_flight = work_dir_in_flight or _in_flight_work_dir(
        runs, config.retention.running_stale_hours)
    if in_flight:
        plan.skipped.append(f"the work dir {config.run.work_dir}: a run is in flight "
                            f"({in_flight})")
    else:
        plan.deletions += _superseded(config)
        if index_in_flight:
            plan.skipped.append(f"the embedding cache: an index build is in flight "
                                f"({index_in_flight})")
        else:
            plan.deletions += _embedding_shards(config)
    if config.retention.prefect_expired_results:
        plan.deletions += _expired_results(prefect_storage, plan)
    return plan


def _remove(paths: Iterable[str]) -> None:
    for p in map(Path, paths):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def apply_prune(plan: PrunePlan, uri: str | None) -> None:
    """Carry out `plan`: registry entries and runs through MLflow, files from the disk."""
    run_ids = [d.target for d in plan.deletions if d.kind == "mlflow run"]
    versions = [d for d in plan.deletions if d.kind == "model version"]
    if uri and (run_ids or versions):
        from searchrl.tracking import delete_versions_and_runs

        delete_versions_and_runs(uri, [(name, version) for name, _, version in
                                       (d.target.rpartition(" v") for d in versions)], run_ids)
        _gc_runs(uri, run_ids)
    for d in plan.deletions:
        _remove(d.paths)


def prune(config: PipelineConfig, uri: str | None, *, dry_run: bool = False,
          prefect_storage: Path | None = None) -> PrunePlan:
    """Plan and (unless `dry_run`) apply retention, holding the work dir's training lock (no
    training starts meanwhile) and the index stage dir's lock (the one every `build_index`
    holds, the flow's and the CLI's: no build reads or writes embedding shards meanwhile); a
    lock held elsewhere leaves what it guards alone."""
    from searchrl.train.grpo.checkpoint import CheckpointLockError, checkpoint_dir_lock

    paths = StagePaths(config.run.work_dir)
    with ExitStack() as locks:
        training: str | None = None  # who holds a lock, when another process does
        indexing: str | None = None
        # Nothing there yet: no lock to take (nor a lock file to create).
        if paths.train_dir.is_dir():
            try:
                locks.enter_context(checkpoint_dir_lock(paths.train_dir / CHECKPOINTS))
            except CheckpointLockError as exc:
                training = str(exc)
        if paths.index_dir.is_dir():
            try:
                locks.enter_context(held(paths.index_dir, busy="an index build uses its "
                                         "embedding cache"))
            except BusyError as exc:
                indexing = str(exc)
        plan = plan_prune(config, uri, prefect_storage=prefect_storage,
                          work_dir_in_flight=training, index_in_flight=indexing)
        if not dry_run:
            apply_prune(plan, uri)
        return plan


def prune_after_run(config: PipelineConfig, uri: str, prefect_storage: Path | None
                    ) -> PrunePlan | None:
    """The flow's retention step, after its decision: prune, print what went; a failure is
    logged, never the run's (its decision and artifacts already stand)."""
    if not config.retention.enabled:
        return None
    try:
        plan = prune(config, uri, prefect_storage=prefect_storage)
    except Exception as exc:  # housekeeping: the week's result is already recorded
        log.warning("retention failed (the run's results stand; run `python -m searchrl "
                    "prune --dry-run` to see what it would delete): %s", exc)
        return None
    print(plan.summary(dry_run=False).splitlines()[-1])
    return plan
