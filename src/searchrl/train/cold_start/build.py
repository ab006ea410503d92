"""The cold start: the policy GRPO starts from, built once per config, data and code.

Tiny model: tokenizer trained on corpus + demonstrations, model built from config, SFT on
scripted demonstrations (the train split's, plus extra synthetic worlds' and the corpus as
language-modelling text when configured). Pretrained: loaded, then the same SFT if
`train.sft.enabled`, else saved unchanged (the config refuses a tiny model without SFT: a
random model cannot start RL).

Used by the curriculum stage (which needs the SFT policy to estimate difficulty) and by the
train stage, which reuses the curriculum stage's cold start when the key matches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from searchrl.codehash import code_fingerprint
from searchrl.config import PipelineConfig
from searchrl.datasets.io import atomic_write_text, records_fingerprint
from searchrl.generation.factory import resolve_device
from searchrl.models.prior import is_bundled_prior, prior_fingerprint
from searchrl.models.tiny import init_policy
from searchrl.retrieval.base import Searcher
from searchrl.retrieval.bm25 import BM25Index
from searchrl.retrieval.index_store import LocalSearcher
from searchrl.rl.prompts import ANSWER_OPEN, INFO_CLOSE, INFO_OPEN, build_prompt, format_passages
from searchrl.sinks import MetricsSink, NullSink
from searchrl.train.cold_start.demos import (
    SearcherFactory,
    build_demos,
    corpus_documents,
    world_demos,
)
from searchrl.train.cold_start.sft import run_sft, save_policy
from searchrl.train.seeds import seed_everything
from searchrl.types import Passage, QAExample, SearchHit

SFT_KEY_FILE = "searchrl_sft.json"
SFT_STATS_FILE = "searchrl_sft_stats.json"
WORLD_SEED_STRIDE = 7_919  # extra synthetic worlds of the cold start: base + stride * (i + 1)


def cold_start(config: PipelineConfig, train_examples: Sequence[QAExample],
               passages: Sequence[Passage], searcher: Searcher, out_dir: Path,
               sink: MetricsSink | None = None) -> Path:
    """The policy RL starts from, saved (model + tokenizer) in `out_dir`; returns it.

    SFT on the demonstrations when `train.sft.enabled` (always for a tiny model). Reused as
    is when `out_dir` holds a policy made from the same config inputs, data and code
    (`code_fingerprint(cold_start)`: the helpers below, the demo builder, its BM25 searcher,
    SFT and model code it reaches, so an edited demo builder never reuses an old cold start;
    a key file is written last, so a half-built dir is never reused).
    """
    sink = sink or NullSink()
    cfg = config.train.sft
    # The declared config inputs and the data's content, not ids or counts: a corrected gold
    # answer or an edited passage makes a new start.
    key = {"config": config.inputs_of("cold_start"),
           "train": records_fingerprint(train_examples),
           "passages": records_fingerprint(passages), "code": code_fingerprint(cold_start)}
    if is_bundled_prior(config.model.name_or_path):
        key["base_model"] = prior_fingerprint()  # a new release of the package prepares anew
    key_file = out_dir / SFT_KEY_FILE
    if key_file.is_file() and json.loads(key_file.read_text()) == key:
        return out_dir
    started = time.perf_counter()
    seed_everything(config.run.seed)
    demos = _demonstrations(config, train_examples, passages, searcher, sink) if cfg.enabled else []
    corpus_texts = [p.contents for p in passages] + [d.text for d in demos]
    device = resolve_device(config.run.device)
    model, tokenizer = init_policy(config.model, corpus_texts, seed=config.run.seed)
    if demos:
        model.to(torch.device(device))  # type: ignore[arg-type]  # SFT on run.device
        result = run_sft(model, tokenizer, demos, cfg, seed=config.run.seed,
                         on_step=lambda s, loss: sink.log_metrics({"sft_loss": loss}, step=s))
        sink.log_metrics({"sft_seconds": result.seconds, "sft_steps": result.steps,
                          "sft_final_loss": result.losses[-1]})
    save_policy(model, tokenizer, out_dir)
    atomic_write_text(out_dir / SFT_STATS_FILE,
                      json.dumps({"seconds": time.perf_counter() - started,
                                  "demos": len(demos), "sft_device": device if demos else None}))
    atomic_write_text(key_file, json.dumps(key))
    return out_dir


def _demonstrations(config: PipelineConfig, train_examples: Sequence[QAExample],
                    passages: Sequence[Passage], searcher: Searcher,
                    sink: MetricsSink) -> list[Any]:
    """The SFT demonstrations: scripted search chains on the train split and on the extra
    synthetic worlds, then the corpus as text when `train.sft.corpus_lm`; counts logged."""
    cfg = config.train.sft
    kwargs = demo_kwargs(config)
    demos, stats = build_demos(train_examples, {p.id: p for p in passages}, searcher,
                               n_demos=cfg.n_demos, seed=config.run.seed, **kwargs)
    extra, extra_stats = world_demos(
        config.data.synthetic, extra_world_seeds(config), bm25_searcher(config),
        exclude_names={p.title for p in passages if p.title},
        n_demos=cfg.extra_world_demos, **kwargs)
    demos += extra
    if cfg.corpus_lm:
        demos += corpus_documents(passages, information_block)
    stats.built += extra_stats.built
    for kind, n in extra_stats.kinds.items():
        stats.kinds[kind] = stats.kinds.get(kind, 0) + n
    sink.log_metrics({"sft_demos_extra_worlds": extra_stats.built,
                      "sft_demos": stats.built,
                      "sft_demos_skipped_no_chain": stats.skipped_no_chain,
                      "sft_demos_skipped_not_retrieved": stats.skipped_gold_not_retrieved}
                     | {f"sft_demos_{k}": v for k, v in stats.kinds.items()}
                     # Extra worlds' skips and per-type counts too: with n_demos 0 (tiny) the
                     # train-split figures above are all 0 and hid that no org demo was built.
                     | {"sft_demos_extra_skipped_not_retrieved":
                        extra_stats.skipped_gold_not_retrieved}
                     | {f"sft_demos_type_{k}":
                        stats.by_type.get(k, 0) + extra_stats.by_type.get(k, 0)
                        for k in stats.by_type | extra_stats.by_type})
    return demos


def demo_kwargs(config: PipelineConfig, *, gold_only: bool = False) -> dict[str, Any]:
    """How `build_demos` / `world_demos` format a demonstration: the rollout loop's prompt,
    `<information>` block, top-k and answer tag, and the SFT config's shares of deliberately
    imperfect and baseline-format demonstrations (`gold_only`: none, as PPO-ptx replays)."""
    cfg = config.train.sft
    return {"prompt_fn": build_prompt, "info_fn": information_block,
            "top_k": config.rollout.top_k,
            "imperfect_fraction": 0.0 if gold_only else cfg.imperfect_fraction,
            "imperfect_kinds": cfg.imperfect_kinds,
            "baseline_fraction": 0.0 if gold_only else cfg.baseline_fraction,
            "answer_open": ANSWER_OPEN}


def information_block(hits: Sequence[SearchHit]) -> str:
    """The `<information>` block exactly as the rollout loop inserts it (before truncation)."""
    return f"{INFO_OPEN}{format_passages(hits)}{INFO_CLOSE}"


def extra_world_seeds(config: PipelineConfig, first: int = 0, count: int | None = None
                      ) -> list[int]:
    """Seeds of the extra synthetic worlds the cold start draws demonstrations from (none
    equals the evaluated world's): worlds `first` .. `first + count - 1` of the sequence
    (default: the cold start's `train.sft.extra_worlds`; PPO-ptx takes the ones after)."""
    base = config.data.synthetic.seed
    count = config.train.sft.extra_worlds if count is None else count
    return [base + WORLD_SEED_STRIDE * (i + 1) for i in range(first, first + count)]


def bm25_searcher(config: PipelineConfig) -> SearcherFactory:
    """An in-memory BM25 searcher per extra world (the index stage's BM25 settings)."""
    icfg = config.index.model_copy(update={"retriever": "bm25"})

    def make(passages: Sequence[Passage]) -> Searcher:
        bm25 = BM25Index.build([p.contents for p in passages], k1=icfg.bm25_k1, b=icfg.bm25_b,
                               stopwords=icfg.bm25_stopwords)
        return LocalSearcher(passages, icfg, bm25=bm25)

    return make


def cold_start_seconds(sft_dir: Path, measured: float) -> float:
    """Cold-start wall time: as recorded when it was built (it may have been built earlier by
    the curriculum stage and only reused now)."""
    stats = sft_dir / SFT_STATS_FILE
    if stats.is_file():
        return float(json.loads(stats.read_text()).get("seconds", measured))
    return measured
