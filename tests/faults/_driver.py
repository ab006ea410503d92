"""Trainer driver for the fault tests: the real `train_grpo` (DeepSpeed CPU engine, real
checkpoints) on a tiny policy with a deterministic fake rollout function, in its own process
so a test can SIGKILL it.

    python tests/faults/_driver.py --init INIT --out OUT [--pause-at POINT --marker FILE]

POINT makes the process stop at a precise moment and wait there to be killed:
    update:K          after the optimizer step of the K-th update of this process (the new
                      weights exist only in memory; metrics and checkpoint not yet written)
    save:K:data       inside the save of checkpoint K, after its data files are written to
                      the temp dir and before they are fsynced and a manifest exists
    save:K:manifest   inside the save of checkpoint K, after the temp dir's manifest is
                      written and before the dir is renamed into place
On reaching it the driver writes `--marker` (atomically) and sleeps; nothing else is faked.

Without --pause-at the run finishes and prints one JSON line (steps_done, resumed_from,
losses). `--init` without `--out` builds the tiny starting policy instead.

Several ranks (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment, one process
each): ZeRO-2, dynamic filtering without refills, and on rank 1 every second question of a
rollout call gets one constant reward, so rank 1 has fewer informative groups (and
micro-batches) than rank 0. `--trace FILE` appends one JSON line per rollout call (rank,
question ids, sha256 of the weights the rollouts sampled with); `--stop-after N` stops after
N steps of this process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Run as a script: the repository root makes the shared `tests.train_fixture` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from searchrl.config import PipelineConfig
from tests.train_fixture import build_init_policy, fake_rollouts, tiny_config, train_examples

STEPS, CHECKPOINT_EVERY = 4, 2


def config(work_dir: Path) -> PipelineConfig:
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return tiny_config(work_dir, steps=STEPS, checkpoint_every=CHECKPOINT_EVERY)
    cfg = tiny_config(work_dir, steps=STEPS, checkpoint_every=CHECKPOINT_EVERY,
                      zero_stage=2, questions_per_step=4)
    curriculum = cfg.curriculum.model_copy(update={"dynamic_filtering": True,
                                                   "max_refill_rounds": 0})
    return cfg.model_copy(update={"curriculum": curriculum})


def traced_rollouts(trace: Path | None) -> Any:
    """fake_rollouts, uneven across ranks and optionally traced (see the module docstring)."""
    rank = int(os.environ.get("RANK", "0"))

    def rollouts(examples: Any, generator: Any, *args: Any, **kwargs: Any) -> Any:
        batch = fake_rollouts(examples, generator, *args, **kwargs)
        group = kwargs["group_size"]
        if rank == 1:
            for i, record in enumerate(batch.records):
                if (i // group) % 2 == 1:
                    record.reward = 0.25
        if trace is not None:
            sha = hashlib.sha256()
            for name, tensor in sorted(generator.model.state_dict().items()):
                sha.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
            with trace.open("a") as fh:
                fh.write(json.dumps({"rank": rank, "ids": [e.id for e in examples],
                                     "weights": sha.hexdigest()}) + "\n")
        return batch

    return rollouts


examples = train_examples
build_init = build_init_policy


# --- pause points (the process waits there for its SIGKILL)


def _wait_for_kill(marker: Path, what: str) -> None:
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(what)
    tmp.replace(marker)
    time.sleep(3600)
    sys.exit(f"pause point {what!r}: nobody killed this process")


def _arm(point: str, marker: Path) -> None:
    import searchrl.train.grpo.checkpoint as ckpt
    import searchrl.train.grpo.trainer as grpo

    kind, _, rest = point.partition(":")
    if kind == "update":
        target, real_update, calls = int(rest), grpo.ppo_update, [0]

        def update(*args: Any, **kwargs: Any) -> Any:
            out = real_update(*args, **kwargs)
            calls[0] += 1
            if calls[0] == target:
                _wait_for_kill(marker, point)
            return out

        grpo.ppo_update = update
        return
    step_s, _, where = rest.partition(":")
    name = f".{ckpt.step_dir(Path('.'), int(step_s)).name}.tmp"
    if kind == "save" and where == "data":
        real_fsync_tree = ckpt._fsync_tree

        def fsync_tree(directory: Path) -> None:
            if directory.name == name:
                _wait_for_kill(marker, point)
            real_fsync_tree(directory)

        ckpt._fsync_tree = fsync_tree
        return
    if kind == "save" and where == "manifest":
        real_fsync = os.fsync

        def fsync(fd: Any) -> None:
            real_fsync(fd)
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if path.name == "manifest.json" and path.parent.name == name:
                _wait_for_kill(marker, point)

        os.fsync = fsync
        return
    raise SystemExit(f"--pause-at {point!r}: expected update:K, save:K:data or save:K:manifest")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--init", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--pause-at", default=None)
    parser.add_argument("--marker", type=Path, default=None)
    parser.add_argument("--trace", type=Path, default=None)
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args(argv)
    # One intra-op thread: fast on a shared CPU, and the same reduction order in every run.
    torch.set_num_threads(1)
    if args.out is None:
        build_init(args.init)
        return 0
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.pause_at:
        if args.marker is None:
            raise SystemExit("--pause-at needs --marker")
        _arm(args.pause_at, args.marker)
    from searchrl.train.grpo.trainer import train_grpo

    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rollouts = traced_rollouts(args.trace) if multi or args.trace else fake_rollouts
    result = train_grpo(config(args.out), examples(), None, args.init, args.out,
                        rollout_fn=rollouts, progress=False, stop_after=args.stop_after)
    print(json.dumps({"steps_done": result.steps_done, "resumed_from": result.resumed_from,
                      "losses": result.losses}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
