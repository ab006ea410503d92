"""Does the world need learning? The scripted system's EM (src/searchrl/eval/scripted.py: the
best fixed program written against the train split's phrasings) per split and slice.

    .venv/bin/python benchmarks/bench_scripted.py [--config configs/tiny.yaml]
        [--worlds SEED ...] [--profiles reading classic] [--out docs/results/scripted.md]

Default worlds: the config's own (the sealed headline world) and its tuning worlds. The
issue-33 bar: at most 0.5 EM on the default world's test split (tests/unit/test_scripted.py
asserts it at the demo's sizes). Scored with the pipeline's own exact match.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from searchrl.config import load_config
from searchrl.data.synthetic import generate_world
from searchrl.eval.metrics import bootstrap_mean_ci
from searchrl.eval.scripted import ScriptedSystem
from searchrl.rl.rewards import exact_match
from searchrl.train.cold_start import bm25_searcher

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    parser.add_argument("--worlds", nargs="*", type=int, default=None)
    parser.add_argument("--profiles", nargs="+", default=["reading", "classic"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    base = load_config(args.config, args.overrides)
    worlds = args.worlds or [base.data.synthetic.seed, *base.data.synthetic.tuning_seeds[:2]]
    lines = ["| profile | world | split | n | scripted EM [95% CI] | seen phrasing | unseen "
             "phrasing | answer-novel | comparison | alias | namesake | cross-passage |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    slices = ("seen_phrasing", "unseen_phrasing", "answer_novel", "comparison", "alias",
              "namesake", "cross_passage")
    for profile in args.profiles:
        for seed in worlds:
            config = load_config(args.config, [*args.overrides,
                                               f"data.synthetic.profile={profile}",
                                               f"data.synthetic.seed={seed}"])
            world = generate_world(config.data.synthetic)
            script = ScriptedSystem(world.splits["train"], bm25_searcher(config)(world.passages))
            sealed = "" if seed in config.data.synthetic.tuning_seeds else " (sealed)"
            for split in ("train", "dev", "test"):
                rows = world.splits[split]
                ems: list[float] = []
                hit: Counter[str] = Counter()
                n: Counter[str] = Counter()
                for ex in tqdm(rows, desc=f"{profile} {seed} {split}", leave=False):
                    answer = script.answer(ex.question).answer
                    em = exact_match(answer, ex.golden_answers) if answer else 0.0
                    ems.append(em)
                    names = set(ex.slices) | ({"seen_phrasing"} if "unseen_phrasing"
                                              not in ex.slices else set())
                    for name in names:
                        n[name] += 1
                        hit[name] += em
                ci = bootstrap_mean_ci(ems, seed=0)
                cells = [f"{hit[s] / n[s]:.3f} ({n[s]})" if n[s] else "-" for s in slices]
                lines.append(f"| {profile} | {seed}{sealed} | {split} | {len(rows)} | "
                             f"{ci.mean:.3f} [{ci.lo:.3f}, {ci.hi:.3f}] | "
                             + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    table = "\n".join(lines)
    if args.out is not None:
        args.out.write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
