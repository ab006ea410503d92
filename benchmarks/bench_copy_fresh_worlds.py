"""Does a policy copy names it has never seen? Per question type, on hundreds of questions
(issue 25, item 1).

The test split holds 1-11 questions of a type (5 founder questions on one world), so "above
its SFT start" there turns on one answer. This measures the skill itself on many: gold
demonstrations of synthetic worlds no run trained on (`--first-world` onwards in the seed
sequence the cold start and PPO-ptx draw from), every context exactly as the rollout would
have built it with the gold searches (teacher-forced), and at each `<search>` and `<answer>`
the policy's greedy continuation up to the closing tag, through the pipeline's generator
(`make_generator`). A continuation scores 1 when it equals the gold query / answer after the
one answer normaliser. Per type: the answer's copy rate and the queries', n, and each
policy's paired difference to the first policy with a bootstrap interval (questions
resampled).

    .venv/bin/python benchmarks/bench_copy_fresh_worlds.py \\
        --policy sft=runs/tiny/train_policy/sft \\
        --policy trained=runs/tiny/train_policy/best_policy \\
        [--config configs/tiny.yaml] [--worlds 8] [--per-type 100] [--out copy.md] [overrides]

Overrides are the run's (e.g. `data.synthetic.seed=21 "data.synthetic.hop_mix={...}"`): the
fresh worlds take its world sizes and hop mix. About a minute per policy on 2 cores.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from searchrl.config import load_config
from searchrl.eval.metrics import paired_bootstrap_delta
from searchrl.generation.base import Generator, SamplingParams
from searchrl.generation.factory import make_generator
from searchrl.rl.rewards import exact_match
from searchrl.train.cold_start.build import bm25_searcher, demo_kwargs, extra_world_seeds
from searchrl.train.cold_start.demos import Demo, world_demos
from searchrl.train.cold_start.sft import tokenize_demo

_CLOSE = {"<search>": "</search>", "<answer>": "</answer>"}


@dataclass(frozen=True)
class Slot:
    """One place the policy writes a name: the context before it, the gold text, its kind."""

    demo: int  # index into the demonstrations
    qtype: str
    kind: str  # "answer" or "query"
    context: list[int]
    gold: str


def _slots(demos: list[Demo], tokenizer: PreTrainedTokenizerBase, max_len: int) -> list[Slot]:
    opens = {tokenizer.convert_tokens_to_ids(t): t for t in _CLOSE}
    closes = {tokenizer.convert_tokens_to_ids(t) for t in _CLOSE.values()}
    slots = []
    for i, demo in enumerate(demos):
        row = tokenize_demo(demo, tokenizer, max_len)
        ids = row.input_ids
        for pos, tok in enumerate(ids):
            # An opener the policy wrote (inserted blocks never hold one).
            if tok not in opens or not row.loss_mask[pos]:
                continue
            end = next(j for j in range(pos + 1, len(ids)) if ids[j] in closes)
            gold = str(tokenizer.decode(ids[pos + 1:end])).strip()
            kind = "answer" if opens[tok] == "<answer>" else "query"
            slots.append(Slot(i, demo.qtype, kind, ids[: pos + 1], gold))
    return slots


def _copied(generator: Generator, slots: list[Slot], batch: int, label: str) -> list[float]:
    tokenizer = generator.tokenizer
    params = SamplingParams(max_new_tokens=32, greedy=True, stop=tuple(_CLOSE.values()))
    scores: list[float] = []
    for start in tqdm(range(0, len(slots), batch), desc=label, unit="batch"):
        part = slots[start:start + batch]
        outs = generator.generate([s.context for s in part], params)
        generator.release()
        for slot, out in zip(part, outs, strict=True):
            text = tokenizer.decode(out.token_ids, skip_special_tokens=False)
            text = text.split(_CLOSE["<answer>"])[0].split(_CLOSE["<search>"])[0]
            scores.append(exact_match(text, [slot.gold]))
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", required=True, metavar="LABEL=DIR",
                        help="a saved policy; the first is the comparator (repeat)")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--worlds", type=int, default=8)
    parser.add_argument("--first-world", type=int, default=30,
                        help="index of the first fresh world in the seed sequence (the cold "
                             "start takes 0.., PPO-ptx the ones after it)")
    parser.add_argument("--per-type", type=int, default=100,
                        help="at most this many questions of each type (the worlds' train "
                             "splits, each question once)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides)
    used = config.train.sft.extra_worlds + config.train.ptx_worlds
    if args.first_world < used:
        parser.error(f"--first-world {args.first_world}: worlds 0..{used - 1} are the cold "
                     "start's and PPO-ptx's")
    policies = dict(p.split("=", 1) for p in args.policy)
    seeds = extra_world_seeds(config, first=args.first_world, count=args.worlds)
    every, _ = world_demos(config.data.synthetic, seeds, bm25_searcher(config),
                           n_demos=args.worlds * config.data.synthetic.n_train,
                           **demo_kwargs(config, gold_only=True))
    # Each question once (a world's demos cycle through its train split), capped per type.
    unique = list({d.example_id: d for d in every}.values())
    taken: dict[str, int] = defaultdict(int)
    demos = []
    for demo in unique:
        if taken[demo.qtype] < args.per_type:
            taken[demo.qtype] += 1
            demos.append(demo)
    results: dict[str, list[float]] = {}
    slots: list[Slot] = []
    for label, path in policies.items():
        generator = make_generator(config, policy_dir=path)
        mine = _slots(demos, generator.tokenizer, config.train.sft.max_len)
        # Every policy's tokenizer is its own world's; the slots are the same questions.
        assert not slots or [(s.demo, s.kind) for s in mine] == [(s.demo, s.kind) for s in slots]
        slots = mine
        results[label] = _copied(generator, mine, args.batch, label)

    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, slot in enumerate(slots):
        groups[(slot.qtype, slot.kind)].append(i)
        groups[("all", slot.kind)].append(i)
    labels = list(policies)
    head = ("| type | slot | n | " + " | ".join(labels)
            + "".join(f" | {b} - {labels[0]}" for b in labels[1:]) + " |")
    lines = [f"Fresh worlds {seeds} ({len(demos)} gold demonstrations, {len(slots)} slots); "
             f"`{' '.join([args.config, *args.overrides])}`", "", head,
             "|" + "---|" * (3 + 2 * len(labels) - 1)]
    for (qtype, kind), idx in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        cells = [f"{fmean(results[lb][i] for i in idx):.3f}" for lb in labels]
        for other in labels[1:]:
            d = paired_bootstrap_delta([results[other][i] for i in idx],
                                       [results[labels[0]][i] for i in idx])
            cells.append(f"{d.mean:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]")
        lines.append(f"| {qtype} | {kind} | {len(idx)} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
