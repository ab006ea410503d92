"""Training checkpoints: written whole or not at all, verified before use, no pickle.

Layout of `<root>/step_000020/`:
    model.safetensors       policy weights (the engine's module state dict)
    optimizer.pt            optimizer state dict   } torch.save of tensors + plain containers,
    trainer_state.pt        scheduler, RNG states, } loaded with torch.load(weights_only=True),
                            data order, counters   } which refuses pickled objects
    manifest.json           step, format version, sha256 of every file (written last)

A checkpoint is assembled in a hidden temp dir next to the final one and renamed into place
only after every file and the manifest are written and fsynced, so a crash leaves either the
previous checkpoint set or a `.tmp` dir that `latest_checkpoint` ignores and the next save
removes. `latest_checkpoint` returns the newest dir whose manifest and checksums verify.

ZeRO stages 1-3 partition optimizer state across ranks; for those the optimizer/model state
is saved with DeepSpeed's own `save_checkpoint` inside the same temp dir (its files are
checksummed like ours; DeepSpeed's loader unpickles them, so only resume from checkpoints
this pipeline wrote: the checksums are the guard).

Several ranks (one shared filesystem): every rank writes its own `trainer_state.pt`
(`trainer_state_rank{r}.pt` for r > 0: each rank samples its own shard of questions), rank 0
alone makes the temp dir, the replicated ZeRO-0 weights, the manifest and the rename, with
barriers between; the manifest records the world size and resuming with another refuses.

Run identity: `run_identity` hashes what a checkpoint must match to be resumed (the settings
that shape the training run, the start policy, the questions' content);
`prepare_checkpoint_dir` moves another run's checkpoints aside (`checkpoints.superseded-<time>`,
kept as evidence), returns the checkpoint to resume (or None), and refuses when checkpoints
exist but none verifies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from searchrl.config import PipelineConfig
from searchrl.datasets.io import (
    atomic_write_text,
    content_sha256,
    publish_dir,
    records_fingerprint,
)
from searchrl.locks import held, lock_path  # noqa: F401  (lock_path: re-exported)
from searchrl.train.distributed.deepspeed_setup import barrier, rank, world_size
from searchrl.types import QAExample

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
STEP_PREFIX = "step_"
RUN_KEY_FILE = "run_key.json"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


# --- RNG state (as plain containers: torch.load(weights_only=True) accepts these)


def capture_rng() -> dict[str, Any]:
    np_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    state: dict[str, Any] = {
        "python": _to_plain(random.getstate()),
        "numpy": [np_state[0], torch.from_numpy(np.asarray(np_state[1]).copy()),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_to_tuple(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_to_plain(v) for v in value]
    return value


def _to_tuple(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_to_tuple(v) for v in value)
    return value


# --- files and checksums


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())


def step_dir(root: Path, step: int) -> Path:
    return root / f"{STEP_PREFIX}{step:06d}"


def state_file(rank_no: int) -> str:
    return "trainer_state.pt" if rank_no == 0 else f"trainer_state_rank{rank_no}.pt"


def _uses_native_zero(engine: Any) -> bool:
    return int(engine.zero_optimization_stage()) > 0


def save_checkpoint(root: Path, step: int, engine: Any, trainer_state: dict[str, Any],
                    keep: int = 2) -> Path:
    """Write checkpoint `step` under `root` atomically; prune to the newest `keep`.

    `trainer_state` holds plain containers/tensors only (counters, data order, anything the
    loop needs to continue); the scheduler and RNG states are added here.
    """
    root = Path(root)
    me, lead = rank(), rank() == 0
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    if lead:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    barrier()
    state = dict(trainer_state)
    state["rng"] = capture_rng()
    state["step"] = step
    if engine.lr_scheduler is not None:
        state["scheduler"] = engine.lr_scheduler.state_dict()
    if _uses_native_zero(engine):
        engine.save_checkpoint(str(tmp / "deepspeed"), tag="state", save_latest=False)
    elif lead:
        module = engine.module
        weights = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
        # Tied embeddings appear twice in the state dict; safetensors stores shared storage once.
        save_file(_dedupe_shared(weights), str(tmp / "model.safetensors"))
        torch.save(engine.optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(state, tmp / state_file(me))
    barrier()
    if lead:
        _fsync_tree(tmp)
        files = {str(p.relative_to(tmp)): content_sha256(p)
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"format_version": FORMAT_VERSION, "step": step, "files": files,
                    "zero_stage": int(engine.zero_optimization_stage()),
                    "world_size": world_size()}
        mpath = tmp / "manifest.json"
        mpath.write_text(json.dumps(manifest, indent=2))
        with mpath.open("rb") as fh:
            os.fsync(fh.fileno())
        publish_dir(tmp, final)
        _prune(root, keep)
    barrier()
    return final


def _dedupe_shared(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    seen: dict[int, str] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen and tensor.numel() > 0:
            out[name] = tensor.clone()
        else:
            seen[ptr] = name
            out[name] = tensor
    return out


def _prune(root: Path, keep: int) -> None:
    for stale in root.glob(f".{STEP_PREFIX}*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    done = sorted(p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir())
    for old in done[: max(0, len(done) - max(keep, 1))]:
        shutil.rmtree(old, ignore_errors=True)


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """The manifest, after checking every listed file's sha256; raises CheckpointError."""
    mpath = Path(path) / "manifest.json"
    if not mpath.is_file():
        raise CheckpointError(f"{path}: no manifest.json (incomplete checkpoint)")
    try:
        manifest: dict[str, Any] = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{mpath}: not valid JSON: {exc.msg}") from exc
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{mpath}: format_version {manifest.get('format_version')!r}, "
                              f"this code reads {FORMAT_VERSION}")
    for name, sha in manifest.get("files", {}).items():
        file = Path(path) / name
        if not file.is_file():
            raise CheckpointError(f"{file}: listed in the manifest but missing")
        if content_sha256(file) != sha:
            raise CheckpointError(f"{file}: checksum mismatch (corrupt or modified)")
    return manifest


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete, verified checkpoint under `root`, else None (corrupt ones skipped)."""
    root = Path(root)
    if not root.is_dir():
        return None
    for candidate in sorted((p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir()), reverse=True):
        try:
            verify_checkpoint(candidate)
        except CheckpointError as exc:
            log.warning("skipping checkpoint %s: %s", candidate, exc)
            continue
        return candidate
    return None


def safe_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError and friends: refuse, never fall back
        raise CheckpointError(f"{path}: refused to load (not plain tensors/containers; "
                              f"pickled objects are not accepted): {exc}") from exc


def load_checkpoint(path: Path, engine: Any) -> dict[str, Any]:
    """Verify and restore model, optimizer, scheduler and RNG into `engine`; return the
    trainer state (counters, data order) for the loop."""
    path = Path(path)
    manifest = verify_checkpoint(path)
    if manifest["zero_stage"] != int(engine.zero_optimization_stage()):
        raise CheckpointError(f"{path}: written with ZeRO stage {manifest['zero_stage']}, the "
                              f"engine runs stage {engine.zero_optimization_stage()}; resume "
                              "with the same train.zero_stage or start fresh (train.resume=false)")
    if int(manifest.get("world_size", 1)) != world_size():
        raise CheckpointError(f"{path}: written by {manifest.get('world_size', 1)} ranks, this "
                              f"run has {world_size()} (each rank samples its own question "
                              "shard); resume with the same number of ranks or start fresh "
                              "(train.resume=false)")
    state: dict[str, Any] = safe_load(path / state_file(rank()))
    if _uses_native_zero(engine):
        engine.load_checkpoint(str(path / "deepspeed"), tag="state",
                               load_lr_scheduler_states=False)
    else:
        weights = load_file(str(path / "model.safetensors"))
        try:
            engine.module.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            raise CheckpointError(f"{path}/model.safetensors: does not match the model: {exc}"
                                  ) from exc
        engine.optimizer.load_state_dict(safe_load(path / "optimizer.pt"))
    if "scheduler" in state and engine.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(state["scheduler"])
    restore_rng(state["rng"])
    return state


# --- run identity: whose checkpoints these are


def run_identity(config: PipelineConfig, questions: Sequence[QAExample], init_dir: Path,
                 n_ranks: int, *, init_key_file: Path, code: str) -> str:
    """What a checkpoint must match to be resumed: the settings that shape the training run
    (`config.inputs_of("train_run")`: declared per field in searchrl/config/), the start
    policy (`init_key_file`, the cold start's key, else `init_dir`'s file names and
    sizes), the contents of `train.deepspeed_config`, the questions' content in order (gold
    answers included: a corrected label is another run), the number of ranks, and the
    training code (`code`: the trainer's `code_fingerprint`, which the trainer passes; a code
    or package upgrade must not resume, and republish, last week's final checkpoint). A
    sha256 hex digest."""
    init = (init_key_file.read_text() if init_key_file.is_file() else
            sorted((f.name, f.stat().st_size) for f in init_dir.iterdir() if f.is_file()))
    payload = {"config": config.inputs_of("train_run"), "ranks": n_ranks, "init": init,
               "questions": records_fingerprint(questions),
               "code": code, "deepspeed_config": config.train.deepspeed_config_sha256()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def prepare_checkpoint_dir(root: Path, run_key: str, *, resume: bool) -> Path | None:
    """Make `root` this run's checkpoint dir; return the checkpoint to resume from, or None.

    With `resume`, checkpoints of another run (no or another `RUN_KEY_FILE`) are moved aside
    to `checkpoints.superseded-<time>` (kept as evidence) and this run starts afresh; if
    checkpoints of this run exist but none verifies, raises CheckpointError (never silently
    restart from step 0 over them). Without `resume`, or with nothing to resume, `root` is
    emptied: a fresh run must never resume into (or be pruned together with) an old one.
    Collective: every rank calls it; rank 0 alone moves, removes and writes.
    """
    root = Path(root)
    lead = rank() == 0
    key_path = root / RUN_KEY_FILE
    if (lead and resume and any(root.glob(f"{STEP_PREFIX}*"))
            and (not key_path.is_file() or key_path.read_text() != run_key)):
        aside = root.with_name(f"{root.name}.superseded-{time.strftime('%Y%m%dT%H%M%S')}")
        root.rename(aside)
        log.warning("%s holds checkpoints of a different run (config, start policy or "
                    "questions changed); moved to %s, starting at step 0", root, aside)
    barrier()
    found = latest_checkpoint(root) if resume else None
    if resume and found is None and (bad := sorted(root.glob(f"{STEP_PREFIX}*"))):
        raise CheckpointError(
            f"{root}: no checkpoint passes verification ({', '.join(p.name for p in bad)});"
            " inspect or remove them, or set train.resume=false to start over")
    if found is None and root.exists() and lead:
        shutil.rmtree(root)
    if lead and not key_path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(key_path, run_key)
    barrier()
    return found


# --- who trains into a checkpoint dir
#
# One training at a time per checkpoint dir: a second one (a re-run while a rank of the first
# still trains, two runs on one work_dir) would write the same `.step_N.tmp` dirs. Rank 0
# holds an flock on `<root>.lock` (next to the dir, which `prepare_checkpoint_dir` removes and
# renames) while it trains (`searchrl.locks`); the kernel drops it when the process ends,
# however it ends. The file names its holder for the error.

class CheckpointLockError(CheckpointError):
    """Another live process trains into the checkpoint dir; the message names it."""


def checkpoint_dir_lock(root: Path) -> AbstractContextManager[Path]:
    """Hold the lock of checkpoint dir `root` for the block (re-entrant within this process);
    CheckpointLockError naming the holder (pid, host) when another process holds it."""
    return held(root, busy="another training process holds this checkpoint dir and would "
                           "write the same checkpoints", error=CheckpointLockError)
