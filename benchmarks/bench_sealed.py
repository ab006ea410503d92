"""The headline figures: the evidence recipe (the demo's config, trained longer:
EVIDENCE_RECIPE) on its sealed world, over run seeds, every system.

    .venv/bin/python benchmarks/bench_sealed.py [--seeds 0 1 2] [--work runs/sealed]
        [--out docs/results/evidence_sealed.md] [--config configs/tiny.yaml] [overrides]

Runs the whole pipeline (flows/pipeline.py) once per `run.seed` on the config's own world,
which must not be a tuning world (data.synthetic.tuning_seeds): this is an evaluation, and
nothing here may be used to choose a setting. Tabulates per seed and over seeds: test EM with
95% intervals of every system (no_search, retrieve_once, scripted, sft, rejection_sampling,
trained), format ok, and the paired EM delta of the trained policy against the best
SFT-family system (the gate's comparator) overall and on the unseen-phrasing and
answer-novel slices, against the scripted system, and the dev EM curve. A finished seed is
not re-run while it is this config's and code's (benchmarks/pipeline_runs.py: otherwise the
pipeline runs again and re-runs what the change reaches), and its figures are collected again
whenever its decision is not the one they were collected from.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from pipeline_runs import ensure_run

from searchrl.config import ConfigError, load_config
from searchrl.datasets.io import content_sha256
from searchrl.eval.metrics import QuestionResult, align, paired_bootstrap_delta
from searchrl.eval.results import read_question_results

ROOT = Path(__file__).resolve().parents[1]
# The recipe the headline was measured with; the demo (configs/tiny.yaml) runs a shorter one
# to stay within its 5 minutes. Overrides given on the command line come after these.
EVIDENCE_RECIPE = ("train.steps=40", "train.sft.extra_world_demos=3000",
                   "curriculum.max_questions=240", "train.rejection_sampling.max_questions=240")
SYSTEMS = ("no_search", "retrieve_once", "scripted", "sft", "rejection_sampling", "trained")
SLICES = ("unseen_phrasing", "answer_novel", "comparison")


def _seed_overrides(seed: int, work: Path, extra: list[str]) -> list[str]:
    return [f"run.seed={seed}", f"run.work_dir={work / f'seed{seed}'}",
            f"tracking.tracking_uri=sqlite:///{(work / f'seed{seed}.db').resolve()}", *extra]


def run_seed(config: str, seed: int, work: Path, extra: list[str]) -> float | None:
    """The seed's pipeline run under `work` (pipeline_runs.ensure_run): its wall seconds when
    run now, None when the finished run stands."""
    return ensure_run(config, _seed_overrides(seed, work, extra), work / f"seed{seed}",
                      work / f"seed{seed}.log")


def _delta(a: list[QuestionResult], b: list[QuestionResult], slice_name: str | None
           ) -> dict[str, float]:
    if slice_name is not None:
        a = [r for r in a if slice_name in r.slices]
        b = [r for r in b if slice_name in r.slices]
    x, y = align(a, b)
    d = paired_bootstrap_delta([r.em for r in x], [r.em for r in y], seed=0)
    return {"mean": d.mean, "lo": d.lo, "hi": d.hi, "n": d.n}


def _year_em(results: list[QuestionResult]) -> tuple[int, int]:
    """(correct, asked) over the question types whose answer is a year: whether the policy
    copies a number from the passage it read, which names do not show."""
    years = [r for r in results if (r.qtype or "").endswith("_year")]
    return sum(r.em == 1.0 for r in years), len(years)


def _figures(dest: Path) -> dict[str, Any]:
    results = json.loads((dest / "results.json").read_text())
    decision = json.loads((dest / "decision.json").read_text())
    systems = results["systems"]
    em = {s: systems[s]["summary"]["em"] for s in SYSTEMS if s in systems}
    # The gate's comparator (gate.comparison_baseline "best": the stronger SFT-family system).
    best = decision["comparison_baseline"]
    q = {s: read_question_results(dest / f"questions_{s}.jsonl") for s in em}
    curve = [(r["step"], r["dev_em"]) for r in
             (json.loads(x) for x in (dest / "metrics.jsonl").read_text().splitlines())
             if "dev_em" in r]
    return {"em": em, "best": best,
            "format": systems["trained"]["summary"]["format_rate"],
            "vs_best": {name: _delta(q["trained"], q[best], name) for name in
                        (None, *SLICES)},
            "vs_scripted": _delta(q["trained"], q["scripted"], None) if "scripted" in q
            else None,
            "slice_n": {name: sum(name in r.slices for r in q["trained"]) for name in SLICES},
            "years": {s: _year_em(q[s]) for s in ("sft", "trained") if s in q},
            "curve": curve, "decision": decision.get("label", "?"),
            "seconds": json.loads((dest / "seconds.json").read_text())["seconds"]}


def _decision_sha(work: Path, seed: int) -> str:
    """The run's decision: what a seed's figures were collected from (a run re-run, with
    another config, code or data, decides anew)."""
    return str(content_sha256(work / f"seed{seed}" / "decide_go_no_go" / "decision.json"))


def _collect(work: Path, seed: int, seconds: float | None) -> Path:
    src, dest = work / f"seed{seed}", work / f"figures_seed{seed}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("results.json", *(f"questions_{s}.jsonl" for s in SYSTEMS)):
        if (src / "evaluate_policy" / name).is_file():
            shutil.copy(src / "evaluate_policy" / name, dest / name)
    shutil.copy(src / "decide_go_no_go" / "decision.json", dest / "decision.json")
    shutil.copy(src / "train_policy" / "metrics.jsonl", dest / "metrics.jsonl")
    (dest / "seconds.json").write_text(json.dumps({"seconds": seconds}))
    # Last: a half-collected dir is not read.
    (dest / "key.json").write_text(json.dumps({"decision": _decision_sha(work, seed)}))
    return dest


def _figures_dir(config: str, seed: int, work: Path, extra: list[str]) -> Path:
    """The seed's figures, collected again whenever the run is not the one they were
    collected from; their wall time is the run's when this call made it, else kept only
    while the run is the same ("-": made by an earlier call or by hand)."""
    dest = work / f"figures_seed{seed}"
    seconds = run_seed(config, seed, work, extra)
    key = dest / "key.json"
    if (seconds is None and key.is_file()
            and json.loads(key.read_text()) == {"decision": _decision_sha(work, seed)}):
        return dest
    return _collect(work, seed, seconds)


def _ci(i: dict[str, float], signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(i['mean'])} [{f.format(i['lo'])}, {f.format(i['hi'])}]"


def _table(runs: dict[int, dict[str, Any]]) -> str:
    head = " | ".join(SYSTEMS)
    lines = [f"| seed | {head} | format ok | best SFT-family | trained - it | unseen phrasing "
             "| answer-novel | comparison | trained - scripted | years right (sft, trained) "
             "| dev EM curve | decision | s |",
             "|" + "---|" * (len(SYSTEMS) + 12)]
    for seed, f in sorted(runs.items()):
        cells = [_ci(f["em"][s]) if s in f["em"] else "-" for s in SYSTEMS]
        vs = f["vs_best"]
        curve = " ".join(f"{step}:{em:.2f}" for step, em in f["curve"])
        years = ", ".join(f"{c}/{n}" for c, n in f["years"].values())
        lines.append(
            f"| {seed} | " + " | ".join(cells) + f" | {f['format']:.3f} | {f['best']} | "
            f"{_ci(vs[None], True)} | "
            + " | ".join(f"{_ci(vs[s], True)} (n={vs[s]['n']})" for s in SLICES)
            + f" | {_ci(f['vs_scripted'], True) if f['vs_scripted'] else '-'} | {years} | "
            f"{curve} | "
            f"{f['decision']} | "
            f"{'-' if f['seconds'] is None else format(f['seconds'], '.0f')} |")
    if runs:
        lines += ["", "| over seeds (mean [min, max]) | " + " | ".join(SYSTEMS) + " |",
                  "|---|" + "---|" * len(SYSTEMS)]
        spread = []
        for s in SYSTEMS:
            vals = [f["em"][s]["mean"] for f in runs.values() if s in f["em"]]
            spread.append(f"{statistics.fmean(vals):.3f} [{min(vals):.3f}, {max(vals):.3f}]"
                          if vals else "-")
        lines.append("| test EM | " + " | ".join(spread) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "sealed")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    args.overrides = [*EVIDENCE_RECIPE, *args.overrides]
    world = load_config(args.config, args.overrides).data.synthetic
    if world.seed in world.tuning_seeds:
        raise ConfigError(f"data.synthetic.seed={world.seed} is a tuning world: the headline "
                          "is measured on a sealed one")
    args.work.mkdir(parents=True, exist_ok=True)
    runs: dict[int, dict[str, Any]] = {}
    for seed in args.seeds:
        runs[seed] = _figures(_figures_dir(args.config, seed, args.work, args.overrides))
        print(f"seed {seed}: trained {runs[seed]['em']['trained']['mean']:.3f} "
              f"({runs[seed]['decision']})", flush=True)
    table = _table(runs)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
