"""Rollout throughput: batched KV-reusing rollouts vs per-sample `generate` over the full context.

Usage: .venv/bin/python benchmarks/bench_rollout.py [--batch 32] [--threads 1] [--repeats 5]
       [--out f.json]

For each model (the tiny default, 2 layers x 128, and a 4-layer 256-wide one) on the
synthetic world: a short scripted SFT so the greedy policy really uses the tag protocol
(3 searches, then an answer), then the same greedy `run_rollouts` (batch of distinct test
questions, max_turns=3) with three generators:

    kv      HFGenerator: batched decoding, KV cache kept across turns (the default backend;
            the prompts' shared template prefilled once, stopped rows leave the batch)
    batch   HFGenerator(reuse_cache=False): batched, but re-prefills the context every turn
    plain   HFFullContextGenerator: per sample, `model.generate` re-encoding every turn

and prints tokens/s (policy-sampled tokens / generation seconds) and the speed-up ratios side
by side. Greedy outputs must be identical across the three (the script fails otherwise).
The searcher is a word-overlap scorer over the corpus (retrieval time is reported apart).

Against the machine's limit: the memory bandwidth measured first (best of several copies of a
256 MiB tensor, read + write bytes, with the benchmark's thread count; and a read-only sum of
it, what attention does to the cache), then for the kv run the
bytes a decoder must read: the weights once per forward pass (every parameter, fp32) plus, per
row, the K and V of every cache slot its attention reads (holes included), and that traffic
per second of generation as a share of the measured bandwidth. Small models are far from it:
the time goes to per-pass overhead (Python, kernel launches), not to moving bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from searchrl.config import (
    RewardConfig,
    RolloutConfig,
    SyntheticWorldConfig,
    TinyModelConfig,
)
from searchrl.datasets.synthetic import generate_world
from searchrl.generation.base import Generator
from searchrl.generation.hf import HFFullContextGenerator, HFGenerator
from searchrl.models.tiny import build_tiny_model, train_tokenizer
from searchrl.rl.prompts import INFO_CLOSE, INFO_OPEN, build_prompt, format_passages
from searchrl.rl.rollout import run_rollouts
from searchrl.types import Passage, QAExample, SearchHit

MODELS = {
    "tiny-2x128": TinyModelConfig(),
    "4x256": TinyModelConfig(n_layer=4, n_embd=256, n_head=4),
}
_WORD = re.compile(r"\w+")


class OverlapSearcher:
    """Top-k passages by count of shared lower-cased words (a stand-in retriever)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = list(passages)
        self.words = [set(_WORD.findall(p.contents.lower())) for p in self.passages]

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        out = []
        for q in queries:
            qw = set(_WORD.findall(q.lower()))
            scored = sorted(range(len(self.passages)),
                            key=lambda i: (-len(qw & self.words[i]), i))[:top_k]
            out.append([SearchHit(self.passages[i].id, self.passages[i].title,
                                  self.passages[i].contents, float(len(qw & self.words[i])))
                        for i in scored])
        return out


def demo(example: QAExample, by_id: dict[str, Passage], eos: str) -> str:
    """A scripted trajectory: three searches (supporting docs' titles), then the answer."""
    docs = [by_id[d] for d in example.supporting_doc_ids]
    docs = (docs + [docs[-1]] * 3)[:3]
    text = build_prompt(example.question)
    for doc in docs:
        hit = SearchHit(doc.id, doc.title, doc.contents, 1.0)
        text += (f"<think> I need {doc.title}. </think><search> {doc.title} </search>"
                 f"{INFO_OPEN}{format_passages([hit])}{INFO_CLOSE}")
    return text + f"<think> Done. </think><answer> {example.golden_answers[0]} </answer>{eos}"


def sft(model: Any, tok: Any, texts: list[str], steps: int, batch: int, seed: int) -> float:
    """Teacher-forced cross-entropy on the demos; returns the last loss."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        idx = torch.randint(len(texts), (batch,), generator=gen).tolist()
        enc = tok([texts[i] for i in idx], return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def memory_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of the best of `repeats` tensor copies (bytes read + bytes written)."""
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages first
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * src.numel() * src.element_size() / best


def memory_read_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of the best of `repeats` sums over a tensor (bytes read)."""
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    src.sum()
    best = min(_timed(src.sum) for _ in range(repeats))
    return src.numel() * src.element_size() / best


def _timed(work: Any) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def decode_traffic(generator: HFGenerator, forward_calls: int, kv_slots_read: int) -> float:
    """Bytes a kv generator's passes had to read: weights per pass + K/V per slot read."""
    model, cfg = generator.model, generator.model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    slot = 2 * cfg.num_hidden_layers * heads * head_dim * next(model.parameters()).element_size()
    return float(forward_calls * weights + kv_slots_read * slot)


def run(name: str, generator: Generator, examples: list[QAExample], searcher: OverlapSearcher,
        cfg: RolloutConfig) -> dict[str, Any]:
    counters = ("forward_calls", "kv_slots_read", "decode_tokens", "prefill_tokens")
    before = {c: getattr(generator, c, 0) for c in counters}
    start = time.perf_counter()
    batch = run_rollouts(examples, generator, searcher, cfg, RewardConfig(), group_size=1,
                         greedy=True)
    wall = time.perf_counter() - start
    sampled = sum(sum(r.loss_mask) for r in batch.records)
    return {**{c: getattr(generator, c, 0) - before[c] for c in counters},
        "generator": name, "wall_s": wall, "generation_s": batch.stats["time_generation_s"],
        "retrieval_s": batch.stats["time_retrieval_s"], "sampled_tokens": sampled,
        "tokens_per_s": sampled / batch.stats["time_generation_s"],
        "searches_per_rollout": batch.stats["searches_per_rollout"],
        "turns_mean": batch.stats["turns_mean"],
        "outputs": [r.response_ids for r in batch.records],
        "example_text": batch.records[0].text,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1 is fastest on a shared, loaded CPU)")
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--repeats", type=int, default=5,
                    help="runs per generator, interleaved; the median run is reported")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    world = generate_world(SyntheticWorldConfig())
    by_id = {p.id: p for p in world.passages}
    train, test = world.splits["train"], world.splits["test"][:args.batch]
    tok = train_tokenizer([p.contents for p in world.passages]
                          + [build_prompt(e.question) for e in train], 2048)
    demos = [demo(e, by_id, str(tok.eos_token)) for e in train]
    searcher = OverlapSearcher(world.passages)
    cfg = RolloutConfig(max_turns=3, max_new_tokens_per_turn=32, max_response_tokens=480,
                        info_token_budget=64, top_k=1, max_batch_rows=args.batch)
    bandwidth, read_bandwidth = memory_bandwidth(), memory_read_bandwidth()
    print(f"memory bandwidth ({args.threads} thread(s)): tensor copy {bandwidth / 1e9:.1f} GB/s, "
          f"read-only sum {read_bandwidth / 1e9:.1f} GB/s")
    results: dict[str, Any] = {"batch": args.batch, "threads": args.threads,
                               "bandwidth_gb_s": bandwidth / 1e9,
                               "read_bandwidth_gb_s": read_bandwidth / 1e9, "models": {}}
    for model_name in args.models:
        model = build_tiny_model(MODELS[model_name], tok, seed=0)
        t0 = time.perf_counter()
        loss = sft(model, tok, demos, args.sft_steps, 8, seed=0)
        sft_s = time.perf_counter() - t0
        kv = HFGenerator(model, tok)
        generators: dict[str, Generator] = {
            "kv": kv, "batch": HFGenerator(model, tok, reuse_cache=False),
            "plain": HFFullContextGenerator(model, tok)}
        trials: dict[str, list[dict[str, Any]]] = {name: [] for name in generators}
        for _ in range(args.repeats):  # interleaved, so a slow stretch of the machine hits all
            for name, generator in generators.items():
                trials[name].append(run(name, generator, test, searcher, cfg))
        runs = [sorted(t, key=lambda r: r["generation_s"])[len(t) // 2] for t in trials.values()]
        # kv vs plain within each round (runs seconds apart): robust to the machine's drift.
        round_ratios = sorted(p["generation_s"] / k["generation_s"]
                              for k, p in zip(trials["kv"], trials["plain"], strict=True))
        identical = all(r["outputs"] == runs[0]["outputs"] for t in trials.values() for r in t)
        plain_tps = runs[-1]["tokens_per_s"]
        print(f"\n== {model_name}: batch {args.batch}, max_turns 3, threads {args.threads}, "
              f"SFT {args.sft_steps} steps ({sft_s:.0f}s, loss {loss:.2f}), "
              f"median of {args.repeats} runs each, "
              f"searches/rollout {runs[0]['searches_per_rollout']:.2f}, "
              f"turns/rollout {runs[0]['turns_mean']:.2f}, identical greedy outputs: "
              f"{identical}")
        print("first rollout:", repr(runs[0]["example_text"][:400]))
        print(f"{'generator':<8}{'gen s':>9}{'tokens':>9}{'tokens/s':>11}{'vs plain':>10}")
        for r in runs:
            print(f"{r['generator']:<8}{r['generation_s']:>9.2f}{r['sampled_tokens']:>9d}"
                  f"{r['tokens_per_s']:>11.1f}{r['tokens_per_s'] / plain_tps:>9.2f}x")
        print(f"kv vs plain per round: median {round_ratios[len(round_ratios) // 2]:.2f}x, "
              f"range {round_ratios[0]:.2f}-{round_ratios[-1]:.2f}x over {len(round_ratios)}")
        kv_run = runs[0]
        traffic = (decode_traffic(kv, kv_run["forward_calls"], kv_run["kv_slots_read"])
                   / kv_run["generation_s"])
        print(f"kv: {kv_run['forward_calls']} passes, {kv_run['decode_tokens']} decoded + "
              f"{kv_run['prefill_tokens']} "
              f"prefilled tokens; weights + KV read {traffic / 1e9:.2f} GB/s = "
              f"{traffic / bandwidth:.1%} of the copy bandwidth, "
              f"{traffic / read_bandwidth:.1%} of the read bandwidth")
        results["models"][model_name] = {
            "sft_loss": loss, "identical": identical, "kv_read_gb_s": traffic / 1e9,
            "kv_bandwidth_share": traffic / bandwidth,
            "kv_read_bandwidth_share": traffic / read_bandwidth,
            "runs": [{k: v for k, v in r.items() if k not in ("outputs", "example_text")}
                     for r in runs],
            "kv_vs_plain_per_round": round_ratios,
            "generation_s_all": {name: [r["generation_s"] for r in t]
                                 for name, t in trials.items()},
        }
        if not identical:
            raise SystemExit(f"{model_name}: greedy outputs differ between generators")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
