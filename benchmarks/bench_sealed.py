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
not re-run: its figures under --work are read while they are the run's (its decision) made
with this config; a seed whose effective config changed is run again (the pipeline reuses
the stages the change leaves alone), and one re-run outside this script is read again from
its run directory, its time then unknown ("-").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from searchrl.config import ConfigError, load_config
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


def _run(config: str, seed: int, work: Path, extra: list[str]) -> float:
    overrides = _seed_overrides(seed, work, extra)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
           "TOKENIZERS_PARALLELISM": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    started = time.perf_counter()
    log = work / f"seed{seed}.log"
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, str(ROOT / "flows" / "pipeline.py"), "--config",
                               config, *overrides], cwd=ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if proc.returncode not in (0, 1):  # 1: NO-GO, still a finished run
        raise SystemExit(f"seed {seed}: pipeline exited {proc.returncode}; see {log}")
    return time.perf_counter() - started


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


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _figures_key(config: str, seed: int, work: Path, extra: list[str]) -> dict[str, str]:
    """What a seed's figures were collected from: the effective config and the run's
    decision (a run re-run in place, with other code or data, decides anew)."""
    effective = load_config(config, _seed_overrides(seed, work, extra)).to_dict()
    decision = work / f"seed{seed}" / "decide_go_no_go" / "decision.json"
    return {"config": _sha(json.dumps(effective, sort_keys=True, default=str).encode()),
            "decision": _sha(decision.read_bytes()) if decision.is_file() else ""}


def _collect(work: Path, seed: int, seconds: float | None, key: dict[str, str]) -> Path:
    src, dest = work / f"seed{seed}", work / f"figures_seed{seed}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("results.json", *(f"questions_{s}.jsonl" for s in SYSTEMS)):
        if (src / "evaluate_policy" / name).is_file():
            shutil.copy(src / "evaluate_policy" / name, dest / name)
    shutil.copy(src / "decide_go_no_go" / "decision.json", dest / "decision.json")
    shutil.copy(src / "train_policy" / "metrics.jsonl", dest / "metrics.jsonl")
    (dest / "seconds.json").write_text(json.dumps({"seconds": seconds}))
    (dest / "key.json").write_text(json.dumps(key))  # last: a half-collected dir is not read
    return dest


def _figures_dir(config: str, seed: int, work: Path, extra: list[str]) -> Path:
    """The seed's figures, run or re-collected when the recorded key is not this one."""
    dest = work / f"figures_seed{seed}"
    key = _figures_key(config, seed, work, extra)
    recorded = json.loads((dest / "key.json").read_text()) if (dest / "key.json").is_file() \
        else None
    if recorded == key:
        return dest
    if recorded is None and key["decision"] and (dest / "decision.json").is_file():
        # Collected before figures were keyed: its config is taken as this one's; its time
        # stands while the copied decision is still the run's.
        same = _sha((dest / "decision.json").read_bytes()) == key["decision"]
        seconds = json.loads((dest / "seconds.json").read_text())["seconds"] if same else None
        return _collect(work, seed, seconds, key)
    if recorded is None or recorded["config"] != key["config"] or not key["decision"]:
        seconds = _run(config, seed, work, extra)
        return _collect(work, seed, seconds, _figures_key(config, seed, work, extra))
    return _collect(work, seed, None, key)  # re-run outside this script: its time unknown


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
