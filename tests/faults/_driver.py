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
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from searchrl.config import PipelineConfig, TinyModelConfig
from searchrl.data.synthetic import generate_world
from searchrl.generation.base import SamplingParams
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import RolloutBatch
from searchrl.types import QAExample

WORLD_CFG = {"seed": 5, "n_people": 24, "n_cities": 8, "n_countries": 4,
             "n_organisations": 6, "n_train": 24, "n_dev": 6, "n_test": 6}
TINY = {"vocab_size": 300, "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 256}
STEPS, CHECKPOINT_EVERY = 4, 2


def config(work_dir: Path) -> PipelineConfig:
    """Four steps, a checkpoint every two (so a kill in step 3 or 4 resumes from step 2)."""
    return PipelineConfig.model_validate({
        "run": {"device": "cpu", "work_dir": str(work_dir), "seed": 3},
        "data": {"synthetic": WORLD_CFG},
        "model": {"tiny": TINY},
        "rollout": {"group_size": 4, "max_turns": 2, "max_new_tokens_per_turn": 12,
                    "max_response_tokens": 64, "top_k": 1, "info_token_budget": 24},
        "curriculum": {"dynamic_filtering": False},
        "train": {"steps": STEPS, "questions_per_step": 2, "micro_batch_size": 4, "lr": 1e-2,
                  "kl_coef": 0.1, "checkpoint_every": CHECKPOINT_EVERY,
                  "keep_checkpoints": 3},
    })


def examples() -> list[QAExample]:
    return list(generate_world(config(Path("/tmp")).data.synthetic).splits["train"])


def build_init(out: Path) -> None:
    from searchrl.models.tiny import build_tiny_model, train_tokenizer
    from searchrl.train.sft import save_policy

    world = generate_world(config(Path("/tmp")).data.synthetic)
    tok = train_tokenizer([p.contents for p in world.passages], vocab_size=TINY["vocab_size"])
    save_policy(build_tiny_model(TinyModelConfig(**TINY), tok, seed=0), tok, out)


def fake_rollouts(examples: Sequence[QAExample], generator: Any, searcher: Any,
                  rollout_cfg: Any, reward_cfg: Any, *, group_size: int, greedy: bool = False,
                  seed: int = 0, mode: str = "agentic") -> RolloutBatch:
    """Sample 4 tokens with the live policy, insert 3 'retrieved' tokens (mask 0), sample 4
    more; reward = share of even token ids sampled (varies within a group). Deterministic in
    `seed`, so an interrupted and an uninterrupted run see the same rollouts."""
    tok = generator.tokenizer
    params = SamplingParams(max_new_tokens=4)
    records = []
    for i, ex in enumerate(examples):
        prompt = list(tok(ex.question, add_special_tokens=False)["input_ids"])
        first = generator.generate([prompt] * group_size, params, seed=seed * 97 + i)
        inserted = [5, 6, 7]
        second = generator.generate([prompt + o.token_ids + inserted for o in first], params,
                                    seed=seed * 97 + i + 50)
        for g, (a, b) in enumerate(zip(first, second, strict=True)):
            sampled = a.token_ids + b.token_ids
            reward = sum(t % 2 == 0 for t in sampled) / len(sampled)
            records.append(RolloutRecord(
                example_id=ex.id, sample_index=g, prompt_ids=prompt,
                response_ids=a.token_ids + inserted + b.token_ids,
                loss_mask=[1] * len(a.token_ids) + [0] * 3 + [1] * len(b.token_ids),
                old_logprobs=a.logprobs + [0.0] * 3 + b.logprobs, text="", turns=2,
                reward=reward, correct=reward > 0.5))
    return RolloutBatch(records=records, stats={"time_generation_s": 0.0})


# --- pause points (the process waits there for its SIGKILL)


def _wait_for_kill(marker: Path, what: str) -> None:
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(what)
    tmp.replace(marker)
    time.sleep(3600)
    sys.exit(f"pause point {what!r}: nobody killed this process")


def _arm(point: str, marker: Path) -> None:
    import searchrl.train.checkpoint as ckpt
    import searchrl.train.grpo as grpo

    kind, _, rest = point.partition(":")
    if kind == "update":
        target, real_update, calls = int(rest), grpo._update, [0]

        def update(*args: Any, **kwargs: Any) -> Any:
            out = real_update(*args, **kwargs)
            calls[0] += 1
            if calls[0] == target:
                _wait_for_kill(marker, point)
            return out

        grpo._update = update
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
    from searchrl.train.grpo import train_grpo

    result = train_grpo(config(args.out), examples(), None,
                        args.init, args.out, rollout_fn=fake_rollouts, progress=False)
    print(json.dumps({"steps_done": result.steps_done, "resumed_from": result.resumed_from,
                      "losses": result.losses}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
