"""The scripted baseline, old against new, per slice, on tuning worlds only.

    .venv/bin/python benchmarks/bench_scripted.py [--config configs/tiny.yaml]
        [--worlds SEED ...] [--splits dev test] [--out docs/results/scripted.md]

`new` is the pipeline's `scripted` system (src/searchrl/eval/scripted.py: entities read from
the corpus, question types by the shipped sentence encoder, fixed reading plans); `old` the
issue-33 program it replaced (src/searchrl/eval/scripted_regex.py: regular expressions over the
train split's literal question templates). Both are built from the train split of each world
and score the pipeline's own exact match with the same BM25 searcher. Default worlds: the first
two tuning worlds; any other world is refused (the sealed world stays unread by development).
Time per question: the mean wall time of `answer` (2 shared cores here: compare within a run).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from searchrl.config import load_config
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.tuning import require_tuning_world
from searchrl.eval.metrics import bootstrap_mean_ci
from searchrl.eval.scripted import ScriptedSystem, default_encoder
from searchrl.eval.scripted_regex import RegexScriptedSystem
from searchrl.rl.rewards import exact_match
from searchrl.train.cold_start.build import bm25_searcher
from searchrl.types import QAExample

ROOT = Path(__file__).resolve().parents[1]
SLICES = ("seen_phrasing", "unseen_phrasing", "answer_novel", "alias", "namesake", "comparison",
          "cross_passage")
HEADER = ("| world | split | program | n | EM [95% CI] | " + " | ".join(
    s.replace("_", " ") for s in SLICES) + " | ms / question |")


def _row(program: RegexScriptedSystem | ScriptedSystem, rows: Sequence[QAExample], label: str
         ) -> tuple[str, float]:
    """Table cells (from n on) for one program on `rows`, and its mean seconds a question."""
    ems: list[float] = []
    hit: dict[str, float] = {}
    n: Counter[str] = Counter()
    started = time.perf_counter()
    for ex in tqdm(rows, desc=label, leave=False):
        got = program.answer(ex.question).answer
        em = exact_match(got, ex.golden_answers) if got else 0.0
        ems.append(em)
        names = set(ex.slices) | ({"seen_phrasing"} if "unseen_phrasing" not in ex.slices
                                  else set())
        for name in names:
            n[name] += 1
            hit[name] = hit.get(name, 0.0) + em
    seconds = (time.perf_counter() - started) / max(len(rows), 1)
    ci = bootstrap_mean_ci(ems, seed=0)
    cells = [f"{hit[s] / n[s]:.3f} ({n[s]})" if n[s] else "-" for s in SLICES]
    return (f"{len(rows)} | {ci.mean:.3f} [{ci.lo:.3f}, {ci.hi:.3f}] | " + " | ".join(cells)
            + f" | {1000 * seconds:.1f} |"), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    parser.add_argument("--worlds", nargs="*", type=int, default=None)
    parser.add_argument("--splits", nargs="+", default=["dev", "test"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    base = load_config(args.config, args.overrides)
    worlds = args.worlds or list(base.data.synthetic.tuning_seeds[:2])
    encoder = default_encoder()
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for seed in worlds:
        config = load_config(args.config, [*args.overrides, f"data.synthetic.seed={seed}"])
        require_tuning_world(config)
        world = generate_world(config.data.synthetic)
        searcher = bm25_searcher(config)(world.passages)
        started = time.perf_counter()
        new = ScriptedSystem(world.splits["train"], searcher, encoder=encoder)
        built = time.perf_counter() - started
        old = RegexScriptedSystem(world.splits["train"], searcher)
        print(f"world {seed}: new program built from {len(world.splits['train'])} train "
              f"questions in {built:.1f} s", flush=True)
        programs: dict[str, RegexScriptedSystem | ScriptedSystem] = {
            "old (regex templates)": old, "new (encoder + corpus names)": new}
        for split in args.splits:
            for label, program in programs.items():
                cells, _ = _row(program, world.splits[split], f"{seed} {split} {label}")
                lines.append(f"| {seed} | {split} | {label} | {cells}")
                print(lines[-1], flush=True)
    table = "\n".join(lines)
    if args.out is not None:
        args.out.write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
