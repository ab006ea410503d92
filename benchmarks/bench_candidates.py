"""The design comparison (issue 43 §2): each candidate policy through the whole pipeline on
one tuning world, in one table.

    .venv/bin/python benchmarks/bench_candidates.py [--candidates tiny prior prior3]
        [--world-seed 101] [--work runs/candidates] [--out FILE] [overrides]

A candidate is a config and its overrides (CANDIDATES). Each runs `flows/pipeline.py` once, on
the tuning world `--world-seed` (never the sealed one: this chooses a design), into
`--work/NAME` with its own MLflow database. The tables: per candidate the cold start's pass@8
and pass@1 (the curriculum stage's estimate), the GRPO steps that updated the policy, test
EM of SFT, rejection sampling, trained and scripted, the trained policy's paired delta over
the better of SFT and rejection sampling, format ok, and the wall of the curriculum (cold
start + estimate), train and evaluate stages and of the whole process; then EM per system and
slice. A finished candidate is not run again while it is this config's and code's
(benchmarks/pipeline_runs.py); one made otherwise is run again through the pipeline, which
re-runs only what changed (its whole wall is then that run's).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from pipeline_runs import ROOT, ensure_run
from safetensors import safe_open

from searchrl.config import load_config
from searchrl.curriculum.run import cold_start_pass_at_k
from searchrl.datasets.tuning import require_tuning_world
from searchrl.gate.report import training_steps

CANDIDATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "tiny": ("configs/tiny.yaml", ()),
    "prior": ("configs/prior.yaml", ()),
    "prior3": ("configs/prior.yaml", ("model.prior.layers=3",)),
}
SYSTEMS = ("sft", "rejection_sampling", "trained", "scripted")
STAGES = ("filter_curriculum", "train_policy", "evaluate_policy")


def run_candidate(name: str, world_seed: int, work: Path, extra: list[str]) -> None:
    """The candidate's pipeline run under `work/NAME` (pipeline_runs.ensure_run); its whole
    wall in `NAME.seconds.json` when run now."""
    config, overrides = CANDIDATES[name]
    run_dir = work / name
    args = [f"data.synthetic.seed={world_seed}", f"run.work_dir={run_dir}",
            f"run.name={name}{world_seed}",
            f"tracking.tracking_uri=sqlite:///{(work / f'{name}.db').resolve()}",
            *overrides, *extra]
    require_tuning_world(load_config(config, args))
    seconds = ensure_run(config, args, run_dir, work / f"{name}.log")
    if seconds is not None:  # else the file of the run that stands
        (work / f"{name}.seconds.json").write_text(json.dumps({"seconds": seconds}))


def _parameters(policy_dir: Path) -> int:
    """Stored parameters (a tied output layer counts once, as it is stored once)."""
    with safe_open(str(policy_dir / "model.safetensors"), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 (safe_open is not iterable)


def figures(work: Path, name: str) -> dict[str, Any]:
    """One finished candidate's figures, read from its pipeline work dir."""
    run = work / name
    evaluation = run / "evaluate_policy"
    results = json.loads((evaluation / "results.json").read_text())
    systems = results["systems"]
    train_ref = json.loads((run / "train_policy" / "ref.json").read_text())
    steps = training_steps(run / "train_policy" / "metrics.jsonl",
                           train_ref.get("selected_step"))
    em = {s: systems[s]["summary"]["em"] for s in SYSTEMS if s in systems}
    # The gate's comparator (gate.comparison_baseline "best": the stronger SFT-family system;
    # "best" itself when neither was evaluated, and the gate failed closed).
    decision = json.loads((run / "decide_go_no_go" / "decision.json").read_text())
    best = decision["comparison_baseline"] if decision["comparison_baseline"] in em else None
    # The evaluation stage's own paired delta (trained - it), as the report quotes it.
    delta = results["deltas"][best] if best is not None else None
    seconds_file = work / f"{name}.seconds.json"
    return {
        # The evaluated policy's dir, found under this run dir (a copied run's ref names
        # where it was written).
        "parameters": _parameters(run / "train_policy" / Path(train_ref["policy_dir"]).name),
        "pass": cold_start_pass_at_k(run / "filter_curriculum"),
        "steps": steps,
        "em": em, "best": best,
        "delta": delta,
        "format": {s: systems[s]["summary"]["format_rate"] for s in SYSTEMS if s in systems},
        "slices": {s: {k: v["em"] | {"n": v["n"]} for k, v in systems[s]["by_slice"].items()}
                   for s in SYSTEMS if s in systems},
        "stage_seconds": {st: json.loads((run / st / "ref.json").read_text()).get("seconds")
                          for st in STAGES},
        "seconds": (json.loads(seconds_file.read_text())["seconds"]
                    if seconds_file.is_file() else None),
        "decision": decision.get("label", "?"),
    }


def _ci(i: dict[str, float], signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(i['mean'])} [{f.format(i['lo'])}, {f.format(i['hi'])}]"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def tables(runs: dict[str, dict[str, Any]]) -> str:
    lines = ["| candidate | parameters | cold start pass@8 / pass@1 | steps updated | "
             "SFT | rejection sampling | trained | trained - better of the two | scripted | "
             "format ok, trained | min: curriculum / train / evaluate / whole | decision |",
             "|" + "---|" * 12]
    for name, f in runs.items():
        p = f["pass"]
        passes = f"{p['pass_at_k']:.3f} / {p['pass_at_1']:.3f}" if p else "-"
        st = f["steps"]
        updated = f"{st.steps - st.skipped} of {st.steps}" if st else "-"
        em = f["em"]
        cells = [_ci(em[s]) if s in em else "-" for s in SYSTEMS[:3]]
        walls = " / ".join(_s(f["stage_seconds"][s]) for s in STAGES) + f" / {_s(f['seconds'])}"
        scripted = f"{em['scripted']['mean']:.3f}" if "scripted" in em else "-"
        vs = f"{_ci(f['delta'], True)} ({f['best']})" if f["delta"] else "-"
        lines.append(f"| {name} | {f['parameters']:,} | {passes} | {updated} | "
                     + " | ".join(cells) + f" | {vs} | "
                     f"{scripted} | {f['format']['trained']:.3f} | {walls} | "
                     f"{f['decision']} |")
    slices = sorted({k for f in runs.values() for s in f["slices"].values() for k in s})
    first = next(iter(runs.values()), None)
    ns = {k: first["slices"]["trained"].get(k, {}).get("n", "?") for k in slices} if first else {}
    lines += ["", "| candidate | system | all | " + " | ".join(f"{k} (n={ns[k]})" for k in slices)
              + " | format ok |", "|" + "---|" * (len(slices) + 4)]
    for name, f in runs.items():
        for system in SYSTEMS:
            if system not in f["em"]:
                continue
            by = f["slices"][system]
            lines.append(f"| {name} | {system} | {f['em'][system]['mean']:.3f} | "
                         + " | ".join(f"{by[k]['mean']:.3f}" if k in by else "-" for k in slices)
                         + f" | {f['format'][system]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", nargs="+", choices=sorted(CANDIDATES),
                        default=list(CANDIDATES))
    parser.add_argument("--world-seed", type=int, default=101)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "candidates")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    for name in args.candidates:
        run_candidate(name, args.world_seed, args.work, args.overrides)
        runs[name] = figures(args.work, name)
        print(f"{name}: trained {runs[name]['em']['trained']['mean']:.3f}", flush=True)
    table = tables(runs)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
