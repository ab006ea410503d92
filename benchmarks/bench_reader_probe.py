"""The reader probe: can a candidate model read? Gold passages given, no search (issue 43).

    .venv/bin/python benchmarks/bench_reader_probe.py --model tiny|prior [--budget-s 600]
        [--lr LR] [--micro-batch N] [--world-seed 101] [--train-worlds 101,102,13,7,21]
        [--dev-questions N] [--config configs/tiny.yaml] [--label NAME] [--out probe.md]
        [--json probe.json] [key.sub=value ...]

The fast proxy for each candidate policy model, before paying for its cold start and GRPO:

- train: one gold demonstration per train-split question of the tuning worlds
  (`--train-worlds`, default every `data.synthetic.tuning_seeds`; the sealed world is never
  one), in the rollout's retrieve_once layout with the question's gold passages (its
  `supporting_doc_ids`, in chain order) as the `<information>` block: the prompt, the gold
  passages and the template's `<answer>` are context, the policy writes ` X </answer>`
  (`train.cold_start.demos`' retrieve_once renderer and the cold start's prompt and information
  block).
  The candidate (`init_policy`: `--model tiny` is the config's tiny model from scratch, its
  tokenizer trained on these worlds' corpora and the demonstrations; `--model prior` the
  bundled MiniLM prior prepared from the same texts) is trained with the SFT step of the cold
  start (`train.cold_start.sft.batch_loss_backward`: `train.sft.batch_size`, `micro_batch_size`,
  `context_loss_weight`, AdamW with `weight_decay` and `grad_clip`) for a fixed WALL-CLOCK
  budget (`--budget-s`; the learning rate warms up over its first 5% and decays by a cosine
  to 0 at its end), however many steps that is;
- evaluate: greedy answers on the dev split of `--world-seed` (a tuning world, default the
  first) through the pipeline's own rollout loop in `retrieve_once` mode, with a searcher
  that returns each question's gold passages (all of them: the probe's `rollout.top_k` is
  the longest chain and its information budget the demonstration length, so nothing is cut),
  scored by the reward's EM.

Prints one markdown table row: steps, epochs, tokens/s (every real token through forward and
backward per second of the budget), the final loss, and dev EM overall and by slice: seen /
unseen phrasing (the question form, the world's `unseen_phrasing`), seen / novel answer (a
gold answer that is / is never an answer of the probe's training demonstrations: all of its
worlds, not only the dev world's train split the world's `answer_novel` tag refers to),
alias, cross_passage, comparison, namesake (the world's slices); each with its n in the
header. `--out` appends the row to a markdown file (the header first when the file is new),
so one file collects every candidate; `--json` writes the figures. Any other `key=value` is a
config override as for the pipeline (e.g. `model.prior.layers=3`), so a new candidate needs no
code. The tuning worlds only: the dev world must be one (`require_tuning_world`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from transformers import PreTrainedModel

from searchrl.config import PipelineConfig, SFTConfig, load_config
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.tuning import default_tuning_seed, require_tuning_world
from searchrl.generation.base import Generator
from searchrl.generation.factory import make_generator, resolve_device
from searchrl.models.prior import BUNDLED_PRIOR
from searchrl.models.tiny import init_policy
from searchrl.retrieval.base import SearchError
from searchrl.rl.rollout import run_rollouts
from searchrl.text import normalize_answer
from searchrl.train.cold_start.build import demo_kwargs
from searchrl.train.cold_start.demos import Demo, _render_baseline
from searchrl.train.cold_start.sft import TokenizedDemo, batch_loss_backward, tokenize_demo
from searchrl.train.seeds import seed_everything
from searchrl.types import Passage, QAExample, SearchHit

# The candidates by name: config overrides on top of --config (anything else: key=value).
CANDIDATES: dict[str, list[str]] = {
    "tiny": [],
    "prior": ["model.kind=pretrained", f"model.name_or_path={BUNDLED_PRIOR}"],
}
WARMUP_SHARE = 0.05  # of the budget


# --- the data: gold passages, demonstrations, slices


def gold_hits(example: QAExample, passages: Mapping[str, Passage]) -> list[SearchHit]:
    """The question's gold passages (its chain, in order) as the searcher would return them."""
    return [SearchHit(doc_id=d, title=passages[d].title, contents=passages[d].contents,
                      score=0.0) for d in example.supporting_doc_ids]


def reader_demo(example: QAExample, passages: Mapping[str, Passage],
                config: PipelineConfig) -> Demo:
    """The retrieve_once demonstration of `example` with its gold passages as the block."""
    kw = demo_kwargs(config, gold_only=True)
    return _render_baseline(example, "retrieve_once", {example.question: gold_hits(example,
                                                                                   passages)},
                            kw["prompt_fn"], kw["info_fn"], kw["answer_open"], "")


class GoldSearcher:
    """Each question's gold passages (all of them, whatever `top_k`): the probe's retriever."""

    def __init__(self, examples: Sequence[QAExample], passages: Mapping[str, Passage]) -> None:
        self.hits: dict[str, list[SearchHit]] = {}
        for ex in examples:
            hits = gold_hits(ex, passages)
            if self.hits.setdefault(ex.question, hits) != hits:
                raise ValueError(f"two questions read {ex.question!r} with different gold "
                                 "passages: the probe's searcher answers by question text")

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        missing = [q for q in queries if q not in self.hits]
        if missing:
            raise SearchError(f"not a probe question: {missing[0]!r}")
        return [list(self.hits[q]) for q in queries]


# Slices in table order: (column, what puts a dev question in it).
SLICE_COLUMNS = ("all", "seen_phrasing", "unseen_phrasing", "seen_answer", "novel_answer",
                 "alias", "cross_passage", "comparison", "namesake")


def slice_members(dev: Sequence[QAExample], train_answers: set[str]) -> dict[str, list[int]]:
    """Indices of `dev` per slice column: the world's slices, seen phrasing their complement,
    and novel answer against `train_answers` (normalised answers the probe trained on)."""
    out: dict[str, list[int]] = {name: [] for name in SLICE_COLUMNS}
    for i, ex in enumerate(dev):
        novel = not any(normalize_answer(a) in train_answers for a in ex.golden_answers)
        member = {"all": True,
                  "seen_phrasing": "unseen_phrasing" not in ex.slices,
                  "unseen_phrasing": "unseen_phrasing" in ex.slices,
                  "seen_answer": not novel, "novel_answer": novel}
        for name in SLICE_COLUMNS:
            if member.get(name, name in ex.slices):
                out[name].append(i)
    return out


# --- training for a wall-clock budget


@dataclass
class BudgetRun:
    steps: int = 0
    epochs: float = 0.0
    tokens: int = 0  # real tokens through forward + backward
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def final_loss(self) -> float:
        tail = self.losses[-10:]
        return sum(tail) / len(tail) if tail else math.nan


def lr_factor(elapsed: float, budget: float) -> float:
    """Linear warm-up (from a tenth) over the first `WARMUP_SHARE` of the budget, then cosine
    decay to 0 at its end."""
    frac = min(max(elapsed / budget, 0.0), 1.0)
    return min(1.0, 0.1 + frac / WARMUP_SHARE) * 0.5 * (1.0 + math.cos(math.pi * frac))


def train_for_budget(model: PreTrainedModel, pad_id: int, skip_ids: Sequence[int],
                     data: Sequence[TokenizedDemo], cfg: SFTConfig, budget_s: float,
                     seed: int = 0) -> BudgetRun:
    """SFT steps of `cfg.batch_size` shuffled demonstrations (epoch after epoch) until
    `budget_s` seconds have passed; the model is left in eval mode."""
    if not data:
        raise ValueError("no demonstrations to train on")
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    run = BudgetRun()
    model.train()
    order = list(range(len(data)))
    start = time.perf_counter()
    seen = 0
    while (elapsed := time.perf_counter() - start) < budget_s:
        at = seen % len(data)
        if at == 0:
            rng.shuffle(order)
        batch = [data[i] for i in order[at:at + cfg.batch_size]]
        for group in opt.param_groups:
            group["lr"] = cfg.lr * lr_factor(elapsed, budget_s)
        opt.zero_grad(set_to_none=True)
        loss = batch_loss_backward(model, batch, pad_id, cfg, skip_ids)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        seen += len(batch)
        run.steps += 1
        run.tokens += sum(len(d.input_ids) for d in batch)
        run.losses.append(loss)
    run.seconds = time.perf_counter() - start
    run.epochs = seen / len(data)
    model.eval()  # type: ignore[no-untyped-call]
    return run


# --- the probe


@dataclass
class ProbeResult:
    dev_world: int
    train_worlds: list[int]
    demos: int
    parameters: int
    vocab: int
    lr: float
    setup_s: float
    eval_s: float
    run: BudgetRun
    n: dict[str, int]  # questions per slice column
    em: dict[str, float]  # EM per slice column (NaN: an empty slice)
    world_answer_novel: int  # dev questions the world tags answer_novel (its own train split)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["run"] = {"steps": self.run.steps, "epochs": self.run.epochs,
                      "tokens": self.run.tokens, "seconds": self.run.seconds,
                      "tokens_per_s": self.run.tokens_per_s, "final_loss": self.run.final_loss}
        return out


def reader_em(config: PipelineConfig, dev: Sequence[QAExample],
              passages: Mapping[str, Passage], generator: Generator,
              max_len: int) -> list[float]:
    """Greedy EM per question of `dev`: the rollout loop's retrieve_once mode with every gold
    passage as the block (top_k the longest chain, nothing cut below `max_len` tokens)."""
    rollout = config.rollout.model_copy(update={
        "top_k": max(len(ex.supporting_doc_ids) for ex in dev),
        "info_token_budget": max_len, "max_response_tokens": max_len})
    batch = run_rollouts(dev, generator, GoldSearcher(dev, passages), rollout, config.reward,
                         group_size=1, greedy=True, mode="retrieve_once")
    return [float(r.correct) for r in batch.records]


def probe(config: PipelineConfig, *, budget_s: float, train_worlds: Sequence[int],
          dev_questions: int | None = None) -> ProbeResult:
    """Train `config.model` on the train worlds' reader demonstrations for `budget_s`, then
    greedy EM on the dev split of the configured (tuning) world, by slice."""
    started = time.perf_counter()
    require_tuning_world(config)
    tuning = set(config.data.synthetic.tuning_seeds)
    if not train_worlds or not set(train_worlds) <= tuning:
        raise ValueError(f"train worlds {list(train_worlds)}: tuning worlds only "
                         f"(data.synthetic.tuning_seeds={sorted(tuning)})")
    dev_seed = config.data.synthetic.seed
    worlds = {seed: generate_world(config.data.synthetic.model_copy(update={"seed": seed}))
              for seed in dict.fromkeys([dev_seed, *train_worlds])}
    demos = []
    for seed in train_worlds:
        by_id = {p.id: p for p in worlds[seed].passages}
        demos += [reader_demo(ex, by_id, config) for ex in worlds[seed].splits["train"]]
    dev_passages = {p.id: p for p in worlds[dev_seed].passages}
    dev = list(worlds[dev_seed].splits["dev"][:dev_questions])

    seed_everything(config.run.seed)
    texts = [p.contents for w in worlds.values() for p in w.passages] + [d.text for d in demos]
    model, tokenizer = init_policy(config.model, texts, seed=config.run.seed)
    model.to(torch.device(resolve_device(config.run.device)))  # type: ignore[arg-type]
    sft = config.train.sft
    max_len = min(sft.max_len, getattr(model.config, "max_position_embeddings", sft.max_len))
    data = [tokenize_demo(d, tokenizer, max_len) for d in demos]
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("the candidate's tokenizer has no pad token")
    setup_s = time.perf_counter() - started

    run = train_for_budget(model, pad_id, [int(i) for i in tokenizer.all_special_ids], data,
                           sft, budget_s, seed=config.run.seed)

    started = time.perf_counter()
    correct = reader_em(config, dev, dev_passages,
                        make_generator(config, model=model, tokenizer=tokenizer), max_len)
    members = slice_members(dev, {normalize_answer(d.answer) for d in demos})
    return ProbeResult(
        dev_world=dev_seed, train_worlds=list(train_worlds), demos=len(demos),
        parameters=model.num_parameters(), vocab=len(tokenizer), lr=sft.lr, setup_s=setup_s,
        eval_s=time.perf_counter() - started, run=run,
        n={name: len(idx) for name, idx in members.items()},
        em={name: (sum(correct[i] for i in idx) / len(idx) if idx else math.nan)
            for name, idx in members.items()},
        world_answer_novel=sum("answer_novel" in ex.slices for ex in dev))


# --- the table


def table_header(result: ProbeResult) -> str:
    cells = ["candidate", "params", "lr", "budget s", "steps", "epochs", "tok/s", "loss",
             *(f"{name} (n={result.n[name]})" for name in SLICE_COLUMNS)]
    return "| " + " | ".join(cells) + " |\n|" + "---|" * len(cells)


def table_row(label: str, result: ProbeResult) -> str:
    r = result.run
    cells = [label, f"{result.parameters:,}", f"{result.lr:g}", f"{r.seconds:.0f}", str(r.steps),
             f"{r.epochs:.2f}", f"{r.tokens_per_s:,.0f}", f"{r.final_loss:.3f}",
             *(f"{result.em[name]:.3f}" for name in SLICE_COLUMNS)]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(CANDIDATES), default="tiny",
                        help="the candidate (more: key=value overrides on top of it)")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--budget-s", type=float, default=600.0,
                        help="wall-clock seconds of training (setup and evaluation not counted)")
    parser.add_argument("--lr", type=float, default=None, help="default: train.sft.lr")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="rows per forward pass (default: train.sft.micro_batch_size)")
    parser.add_argument("--world-seed", type=int, default=None,
                        help="the dev world, a tuning world (default: the first)")
    parser.add_argument("--train-worlds", default=None,
                        help="comma-separated tuning worlds whose train splits are the "
                             "demonstrations (default: every data.synthetic.tuning_seeds)")
    parser.add_argument("--dev-questions", type=int, default=None,
                        help="the first N dev questions (default: all)")
    parser.add_argument("--label", default=None, help="the row's name (default: the candidate "
                                                      "and its overrides)")
    parser.add_argument("--out", type=Path, default=None,
                        help="append the row to this markdown file (header when new)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error("--budget-s must be > 0")
    overrides = [*CANDIDATES[args.model], *args.overrides]
    if args.lr is not None:
        overrides.append(f"train.sft.lr={args.lr}")
    if args.micro_batch is not None:
        overrides.append(f"train.sft.micro_batch_size={args.micro_batch}")
    world_seed = (default_tuning_seed(load_config(args.config, overrides))
                  if args.world_seed is None else args.world_seed)
    config = load_config(args.config, [*overrides, f"data.synthetic.seed={world_seed}"])
    train_worlds = ([int(s) for s in args.train_worlds.split(",")] if args.train_worlds
                    else list(config.data.synthetic.tuning_seeds))
    result = probe(config, budget_s=args.budget_s, train_worlds=train_worlds,
                   dev_questions=args.dev_questions)
    label = args.label or " ".join([args.model, *args.overrides])
    header, row = table_header(result), table_row(label, result)
    print(f"\nReader probe: train worlds {result.train_worlds} ({result.demos} gold "
          f"demonstrations), dev world {result.dev_world} ({result.n['all']} questions), "
          f"{result.vocab} tokens vocabulary; setup {result.setup_s:.0f} s, evaluation "
          f"{result.eval_s:.0f} s; novel answer: never an answer of the demonstrations (the "
          f"world's answer_novel tag: {result.world_answer_novel})\n")
    print(header)
    print(row)
    if args.out:
        new = not args.out.is_file() or not args.out.read_text().strip()
        with args.out.open("a", encoding="utf-8") as fh:
            fh.write((header + "\n" if new else "") + row + "\n")
    if args.json:
        args.json.write_text(json.dumps({"label": label, **result.to_dict()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
