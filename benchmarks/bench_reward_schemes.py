"""What a malformed completion should earn, measured: the reward schemes side by side over
seeds on the embedded default (issue 25, item 2).

    .venv/bin/python benchmarks/bench_reward_schemes.py [--schemes scale forfeit penalty]
        [--kinds em f1] [--seeds 0 1 2] [--work runs/reward_schemes]
        [--out docs/results/reward_schemes.md] [--config configs/tiny.yaml] [key.sub=value ...]

Each (seed, scheme, kind) is the whole pipeline (`flows/pipeline.py`, a real Prefect flow run)
with `run.seed=<seed> reward.malformed=<scheme> reward.kind=<kind>` (`reward.correct_bad_format`
/ `reward.malformed_penalty` at their defaults: 0.8 / -0.5) plus the given overrides. One work
dir per seed: what the reward does not shape (validation, the index, the cold start) is
computed by the seed's first run and reused by the others through the stage keys; the
curriculum, training, evaluation and gate re-run. Every run logs to its own MLflow store, so no
run is compared with another's champion. After each run its evaluation `results.json` and
`decision.json` are copied to `<work>/seed<S>_<scheme>_<kind>/`; a finished run is not re-run
while it is this config's and code's (benchmarks/pipeline_runs.py).

Prints, and writes to `--out`, per scheme and kind the trained policy's test EM, F1, format
rate and searches per question as mean [min, max] over seeds, the lowest per-type EM and the
number of types at or below their SFT start, then one row per run. Wall time is the pipeline's.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

from pipeline_runs import ensure_run, made_from

from searchrl.config import load_config
from searchrl.datasets.tuning import default_tuning_seed, require_tuning_world

ROOT = Path(__file__).resolve().parents[1]
TRAINED, SFT = "trained", "sft"


def _overrides(seed: int, scheme: str, kind: str, work: Path, extra: list[str]) -> list[str]:
    name = f"seed{seed}_{scheme}_{kind}"
    return [f"run.seed={seed}", f"reward.malformed={scheme}", f"reward.kind={kind}",
            f"run.work_dir={work / f'seed{seed}'}",
            f"tracking.tracking_uri=sqlite:///{(work / f'{name}.db').resolve()}", *extra]


def _collect(work: Path, seed: int, dest: Path, seconds: float | None,
             made: str) -> dict[str, Any]:
    """Copy the run's evaluation and decision next to the others, with what the run was made
    from (`pipeline_runs.made_from`); the figures this reads."""
    seed_dir = work / f"seed{seed}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copy(seed_dir / "evaluate_policy" / "results.json", dest / "results.json")
    shutil.copy(seed_dir / "decide_go_no_go" / "decision.json", dest / "decision.json")
    (dest / "seconds.json").write_text(json.dumps({"seconds": seconds}))
    (dest / "made_from").write_text(made)  # last: a half-copied dir is not read
    return _figures(dest)


def _figures(dest: Path) -> dict[str, Any]:
    results = json.loads((dest / "results.json").read_text())
    decision = json.loads((dest / "decision.json").read_text())
    systems = results["systems"]
    trained, sft = systems[TRAINED], systems.get(SFT)
    by_type = {t: s["em"]["mean"] for t, s in trained["by_type"].items()}
    sft_by_type = {t: s["em"]["mean"] for t, s in (sft or {}).get("by_type", {}).items()}
    return {"em": trained["summary"]["em"]["mean"], "f1": trained["summary"]["f1"]["mean"],
            "format": trained["summary"]["format_rate"],
            "searches": trained["summary"]["searches_per_question"],
            "sft_em": sft["summary"]["em"]["mean"] if sft else math.nan,
            "min_type": min(by_type.items(), key=lambda kv: kv[1]),
            "types_not_above_sft": sorted(t for t, em in by_type.items()
                                          if t in sft_by_type and em <= sft_by_type[t]),
            "decision": decision.get("label", "?"),
            "seconds": json.loads((dest / "seconds.json").read_text())["seconds"]}


def _spread(values: list[float]) -> str:
    return (f"{statistics.fmean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"
            if values else "-")


def _table(runs: dict[tuple[int, str], dict[str, Any]], schemes: list[str]) -> str:
    lines = ["| scheme_kind | seeds | test EM | F1 | format ok | searches/q | lowest type EM "
             "| types not above SFT |", "|---|---|---|---|---|---|---|---|"]
    for scheme in schemes:
        mine = [f for (_, s), f in sorted(runs.items()) if s == scheme]
        lowest = min((f["min_type"] for f in mine), key=lambda kv: kv[1], default=("-", math.nan))
        lines.append(f"| {scheme} | {len(mine)} | {_spread([f['em'] for f in mine])} "
                     f"| {_spread([f['f1'] for f in mine])} "
                     f"| {_spread([f['format'] for f in mine])} "
                     f"| {_spread([f['searches'] for f in mine])} "
                     f"| {lowest[0]} {lowest[1]:.3f} "
                     f"| {sum(len(f['types_not_above_sft']) for f in mine)} |")
    lines += ["", "| seed | scheme_kind | test EM | SFT start EM | format ok | searches/q "
              "| lowest type (EM) | types not above SFT | decision | wall s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for (seed, scheme), f in sorted(runs.items()):
        lines.append(f"| {seed} | {scheme} | {f['em']:.3f} | {f['sft_em']:.3f} "
                     f"| {f['format']:.3f} | {f['searches']:.2f} "
                     f"| {f['min_type'][0]} ({f['min_type'][1]:.3f}) "
                     f"| {', '.join(f['types_not_above_sft']) or '-'} | {f['decision']} "
                     f"| {'-' if f['seconds'] is None else format(f['seconds'], '.0f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemes", nargs="+", default=["scale", "forfeit", "penalty"])
    parser.add_argument("--kinds", nargs="+", default=["em"], help="reward.kind values")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "reward_schemes")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--report-only", action="store_true",
                        help="tabulate the finished runs only; start none")
    parser.add_argument("--world-seed", type=int, default=None,
                        help="a tuning world (data.synthetic.tuning_seeds; default: the first)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    base = load_config(args.config, args.overrides)
    world_seed = default_tuning_seed(base) if args.world_seed is None else args.world_seed
    args.overrides = [*args.overrides, f"data.synthetic.seed={world_seed}"]
    require_tuning_world(load_config(args.config, args.overrides))
    args.work.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[int, str], dict[str, Any]] = {}
    variants = [f"{scheme}_{kind}" for scheme in args.schemes for kind in args.kinds]
    for seed in args.seeds:
        for variant in variants:
            scheme, kind = variant.split("_")
            dest = args.work / f"seed{seed}_{variant}"
            overrides = _overrides(seed, scheme, kind, args.work, args.overrides)
            made = made_from(args.config, overrides)
            if (dest / "made_from").is_file() and (dest / "made_from").read_text() == made:
                runs[seed, variant] = _figures(dest)  # this config's and code's: not re-run
                continue
            if args.report_only:
                continue
            seconds = ensure_run(args.config, overrides, args.work / f"seed{seed}",
                                 args.work / f"seed{seed}_{variant}.log")
            runs[seed, variant] = _collect(args.work, seed, dest, seconds, made)
            print(f"seed {seed} {variant}: EM {runs[seed, variant]['em']:.3f} format "
                  f"{runs[seed, variant]['format']:.3f}", flush=True)
    table = _table(runs, variants)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
