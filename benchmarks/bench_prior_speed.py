"""The pretrained prior against the tiny model: training and generation tokens/s, side by side.

    .venv/bin/python benchmarks/bench_prior_speed.py [--world 101] [--batches 6] [--full-vocab]

On one tuning world's cold-start texts (its corpus and 2 extra worlds' demonstrations, as
`cold_start` builds them): the tiny model of configs/tiny.yaml (its BPE tokenizer trained on
those texts) and the MiniLM prior prepared from them (models/prior.py, vocabulary trimmed),
each timed in this process on the same demonstrations:
- train: SFT steps of 16 demonstrations (forward, backward, AdamW), tokens/s over the
  demonstrations' real tokens, the first step excluded (warm-up);
- generate: the hf backend's KV-cached greedy decoding of 64 prompts x 48 new tokens.
`--full-vocab` also times the prior with its 30,522-piece vocabulary (what the trim saves).
Each figure is the median of `--repeats` passes; wall times on a shared CPU are pessimistic,
the ratios are what to read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from searchrl.config import load_config
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.tuning import require_tuning_world
from searchrl.generation.base import SamplingParams
from searchrl.generation.hf import HFGenerator
from searchrl.models.prior import BUNDLED_PRIOR
from searchrl.models.tiny import init_policy
from searchrl.rl.prompts import build_prompt
from searchrl.sinks import NullSink
from searchrl.train.cold_start.build import _demonstrations, bm25_searcher
from searchrl.train.cold_start.sft import batch_loss_backward, tokenize_demo


def _train_tps(model: Any, tokenizer: Any, demos: list[Any], cfg: Any, batches: int) -> float:
    data = [tokenize_demo(d, tokenizer, 4096) for d in demos[:16 * (batches + 1)]]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    skip = list(tokenizer.all_special_ids)
    model.train()
    tokens, seconds = 0, 0.0
    for b in range(batches + 1):
        batch = data[16 * b:16 * (b + 1)]
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        batch_loss_backward(model, batch, tokenizer.pad_token_id, cfg, skip)
        opt.step()
        if b:  # the first step warms up allocators and kernels
            seconds += time.perf_counter() - start
            tokens += sum(len(d.input_ids) for d in batch)
    model.eval()
    return tokens / seconds


def _generate_tps(model: Any, tokenizer: Any, questions: list[str]) -> float:
    gen = HFGenerator(model, tokenizer)
    contexts = [tokenizer(build_prompt(q))["input_ids"] for q in questions[:64]]
    params = SamplingParams(max_new_tokens=48, greedy=True)
    limits = [48] * len(contexts)  # every row decodes the same length: no early stops
    start = time.perf_counter()
    outs = gen.generate(contexts, params, limits=limits, keys=[str(i) for i in range(64)])
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=101)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--full-vocab", action="store_true")
    args = ap.parse_args()
    config = load_config("configs/tiny.yaml", [f"data.synthetic.seed={args.world}",
                                               "train.sft.extra_worlds=2",
                                               "train.sft.extra_world_demos=400"])
    require_tuning_world(config)
    world = generate_world(config.data.synthetic)
    searcher = bm25_searcher(config)(world.passages)
    demos = _demonstrations(config, world.splits["train"], world.passages, searcher, NullSink())
    texts = [p.contents for p in world.passages] + [d.text for d in demos]
    questions = [q.question for q in world.splits["dev"]]
    candidates: dict[str, Any] = {
        "tiny": config.model,
        "prior": config.model.model_copy(update={"kind": "pretrained",
                                                 "name_or_path": BUNDLED_PRIOR})}
    rows = []
    for name, mcfg in candidates.items():
        model, tok = init_policy(mcfg, texts, seed=0)
        variants = [(name, model, tok)]
        if name == "prior" and args.full_vocab:
            variants.append(_full_vocab(model, tok))
        for label, m, t in variants:
            train = statistics.median(_train_tps(m, t, demos, config.train.sft, args.batches)
                                      for _ in range(args.repeats))
            gen = statistics.median(_generate_tps(m, t, questions) for _ in range(args.repeats))
            rows.append((label, m.num_parameters(), len(t), train, gen))
    base = rows[0]
    print(f"world {args.world}, torch threads {torch.get_num_threads()}")
    print(f"{'model':<16}{'params':>12}{'vocab':>8}{'train tok/s':>14}{'x tiny':>8}"
          f"{'gen tok/s':>12}{'x tiny':>8}")
    for label, params, vocab, train, gen in rows:
        print(f"{label:<16}{params:>12,}{vocab:>8}{train:>14.0f}{train / base[3]:>8.2f}"
              f"{gen:>12.0f}{gen / base[4]:>8.2f}")


def _full_vocab(model: Any, tokenizer: Any) -> tuple[str, Any, Any]:
    """The prior with the package's whole vocabulary: the trimmed model's layers and a
    30,522-row embedding / output layer (timing only: its rows are not re-mapped)."""
    import copy

    full = copy.deepcopy(model)
    full.resize_token_embeddings(30_522 + len(tokenizer) - tokenizer.vocab_size)
    return "prior, no trim", full, tokenizer


if __name__ == "__main__":
    main()
