#!/usr/bin/env python
"""N weeks of the weekly loop on CPU, end to end, and the figures that show them
(searchrl/simulation/: the world's changes and the figures; flows/weekly/: one week through the
real flow).

--weeks 2 without --fault is the two-week run of docs/results/two_weeks.md: prefect.yaml's
`searchrl-tiny-local` deployment through a process worker, twice, around a steward's step and
new data, then a rollback; it prints why each stage re-ran, the drift, the registry and the
Prefect records. Otherwise the flow runs once per week on one local Prefect server, with a
steward's step, new gold rows and a ~1% corpus change before every week after the first, and
the faults asked for (default: flows/weekly/simulate.py's FAULT_CYCLE, one of each
in every 8 weeks); it prints a line per week and
writes the table and the figure (docs/results/weeks.md).

Usage: .venv/bin/python scripts/weeks.py --data DIR [--weeks N] [--json PATH] [--plot PNG]
    [--table MD] [--fault WEEK:NAME ...] [--week2 key=value ...] [key=value ...]
DIR must be new or empty; key=value overrides go to every run (e.g. tests/flows FAST sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # flows/ and tasks/, as flows/pipeline.py does
    sys.path.insert(0, str(ROOT))

from flows.weekly import simulate  # noqa: E402
from searchrl.exit_codes import exit_on_sigterm  # noqa: E402
from searchrl.simulation import report  # noqa: E402
from searchrl.train.distributed.deepspeed_setup import free_port  # noqa: E402


def _fault(text: str) -> tuple[int, str]:
    week, _, name = text.partition(":")
    if not week.isdigit() or name not in simulate.FAULTS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WEEK:NAME, NAME one of "
                                         f"{', '.join(simulate.FAULTS)}")
    return int(week), name


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()  # a killed run stops the week's flow and its Prefect server
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="a new or empty directory")
    parser.add_argument("--weeks", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--plot", type=Path, default=None, help="N weeks: the figure (PNG)")
    parser.add_argument("--table", type=Path, default=None, help="N weeks: the markdown table")
    parser.add_argument("--port", type=int, default=None, help="Prefect server port (free one)")
    parser.add_argument("--timeout-s", type=int, default=3600, help="per week")
    parser.add_argument("--fault", type=_fault, action="append", default=None,
                        metavar="WEEK:NAME", help=f"one of {', '.join(simulate.FAULTS)}; "
                        "repeatable (default for N != 2: one of each in every 8 weeks)")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--rows-per-week", type=int, default=2)
    parser.add_argument("--corpus-change", type=float, default=0.01)
    parser.add_argument("--rollback-after", type=int, action="append", default=[],
                        metavar="WEEK", help="ask for a rollback after this week")
    parser.add_argument("--week2", action="append", default=[], metavar="KEY=VALUE",
                        help="two weeks: an override for week 2 (and the rollback) only")
    parser.add_argument("overrides", nargs="*", help="key.sub=value, for every run")
    parser.add_argument("--render", type=Path, default=None, metavar="WEEKS_JSON",
                        help="only write --plot / --table from a run's DIR/weeks.json "
                        "(written after every week), running nothing")
    args = parser.parse_args(argv)
    if args.render:
        weeks = json.loads(args.render.read_text())["weeks"]
        if args.plot:
            report.plot_weeks(weeks, args.plot)
        if args.table:
            args.table.write_text(report.weeks_table(weeks) + "\n")
        print("\n".join(report.week_line(w) for w in weeks))
        return 0
    if args.data is None:
        parser.error("--data DIR is required (a new or empty directory)")
    data: Path = args.data.resolve()
    if data.exists() and any(data.iterdir()):
        parser.error(f"--data {data} is not empty: give a new directory")
    if args.weeks < 1:
        parser.error("--weeks must be at least 1")
    data.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    port = args.port or free_port()
    if args.weeks == 2 and args.fault is None and not args.no_faults:
        figures = simulate.two_weeks(data, args.overrides, port, args.timeout_s, args.week2)
        print(report.two_weeks_summary(figures))
    else:
        faults = ({} if args.no_faults else dict(args.fault) if args.fault
                  else simulate.default_faults(args.weeks))
        plan = simulate.Plan(weeks=args.weeks, overrides=args.overrides, faults=faults,
                             rows_per_week=args.rows_per_week,
                             corpus_change=args.corpus_change,
                             rollback_weeks=tuple(args.rollback_after),
                             timeout_s=args.timeout_s)
        figures = simulate.simulate(data, plan, port,
                                    progress=lambda w: print(report.week_line(w), flush=True))
        if args.plot:
            report.plot_weeks(figures["weeks"], args.plot)
        if args.table:
            args.table.write_text(report.weeks_table(figures["weeks"]) + "\n")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
