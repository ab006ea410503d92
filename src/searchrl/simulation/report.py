"""What the weeks show: a line per week, a markdown table and a figure (disk, time per week,
the champion line, quarantined rows), and the two-week run's summary (docs/results/two_weeks.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from searchrl.plots import save_figure

MB = 1024 * 1024


def outcome(week: dict[str, Any]) -> str:
    """GO / NO-GO, or the failure (exit code and the message's last line)."""
    if week.get("completed"):
        decision = week.get("decision") or {}
        return "GO" if decision.get("go") else "NO-GO"
    last = week["attempts"][-1]
    message = (last.get("message") or "").splitlines()
    return f"FAILED exit {last['exit_code']}" + (f": {message[-1][:90]}" if message else "")


def quarantined(week: dict[str, Any]) -> str:
    """Rows quarantined and whether every row is accounted for; `-` when validation itself
    refused this week's files (nothing was validated: the audit on disk is an earlier one)."""
    runs = week.get("runs") or []
    if not week.get("completed") and runs and runs[-1]["stages"] == ["validate_gold_labels"]:
        return "- (validation refused the files)"
    q = week.get("quarantine") or {}
    count = sum(c["quarantined"] for c in q.get("splits", {}).values())
    return f"{count} (accounted: {q.get('accounted')})"


def _version(reg: dict[str, Any], alias: str) -> str:
    found = reg.get(alias)
    return "-" if not found else f"v{found['version']}"


def week_line(week: dict[str, Any]) -> str:
    attempts = week["attempts"]
    killed = " (killed, rerun)" if any(a.get("killed") for a in attempts) else ""
    stages = sum(len(r["stages"]) for r in week.get("runs", []))
    return (f"week {week['week']:>2} {week.get('fault') or '':<20} {week['seconds']:>6.0f} s"
            f"{killed} stages run {stages}; {outcome(week)}; champion "
            f"{_version(week['registry'], 'champion')}, challenger "
            f"{_version(week['registry'], 'challenger')}; quarantined {quarantined(week)}; "
            f"disk {week['disk']['total'] / MB:.1f} MB")


def weeks_table(weeks: list[dict[str, Any]]) -> str:
    rows = ["| week | fault | seconds | stages run | outcome | champion | challenger | "
            "quarantined | disk MB (work / MLflow / cache) |",
            "|---:|---|---:|---:|---|---|---|---|---|"]
    for w in weeks:
        d = w["disk"]
        stages = sum(len(r["stages"]) for r in w.get("runs", []))
        killed = " (killed, rerun)" if any(a.get("killed") for a in w["attempts"]) else ""
        rows.append(
            f"| {w['week']} | {w.get('fault') or ''}{killed} | {w['seconds']:.0f} | {stages} | "
            f"{outcome(w)} | {_version(w['registry'], 'champion')} | "
            f"{_version(w['registry'], 'challenger')} | {quarantined(w)} "
            f"| {d['total'] / MB:.1f} ({d['work'] / MB:.1f} / "
            f"{(d['mlflow_artifacts'] + d['mlflow_db']) / MB:.1f} / "
            f"{d['embedding_cache'] / MB:.2f}) |")
    return "\n".join(rows)


def plot_weeks(weeks: list[dict[str, Any]], path: Path) -> Path:
    """Four panels over the weeks: disk by part, seconds per week (fault weeks marked),
    the champion's and challenger's versions, quarantined rows."""
    x = [w["week"] for w in weeks]
    fig = Figure(figsize=(11, 8))
    disk, times, line, quarantine = fig.subplots(2, 2).ravel()
    for part, label in (("total", "total"), ("work", "work dir"),
                        ("mlflow_artifacts", "MLflow artifacts"), ("mlflow_db", "MLflow db"),
                        ("embedding_cache", "embedding cache"),
                        ("prefect_results", "Prefect results")):
        disk.plot(x, [w["disk"][part] / MB for w in weeks], marker=".", label=label)
    disk.set_title("disk used after each week (retention applied)", fontsize=9)
    disk.set(xlabel="week", ylabel="MB")
    disk.legend(fontsize=7)
    colors = ["tab:red" if not w.get("completed") else
              "tab:orange" if w.get("fault") else "tab:blue" for w in weeks]
    times.bar(x, [w["seconds"] for w in weeks], color=colors)
    for w in weeks:
        if w.get("fault"):
            times.annotate(w["fault"].replace("_", " "), (w["week"], w["seconds"]),
                           rotation=90, fontsize=6, ha="center", va="bottom")
    times.set_title("seconds per week (red: failed; orange: a fault week that completed)",
                    fontsize=9)
    times.set(xlabel="week", ylabel="seconds")
    for alias, style in (("champion", "-o"), ("challenger", "--x")):
        line.plot(x, [int(w["registry"][alias]["version"]) if w["registry"].get(alias)
                      else float("nan") for w in weeks], style, label=alias)
    line.set_title("registry after each week: champion and challenger versions "
                   "(no champion: no GO)", fontsize=9)
    line.set(xlabel="week", ylabel="model version")
    line.legend(fontsize=7)
    q = [w.get("quarantine") or {} for w in weeks]
    refused = [quarantined(w).startswith("-") for w in weeks]
    for key, style in (("rows_in", "-o"), ("clean", "--x")):
        quarantine.plot(x, [v.get("splits", {}).get("train", {}).get(key, float("nan"))
                            if not r else float("nan") for v, r in zip(q, refused, strict=True)],
                        style, label=f"train {key}")
    quarantine.bar(x, [sum(c["quarantined"] for c in v.get("splits", {}).values())
                       for v in q],
                   color=["tab:green" if v.get("accounted") else "tab:red" for v in q],
                   label="quarantined (all sets)")
    for w, r in zip(weeks, refused, strict=True):
        if r:
            quarantine.annotate("refused", (w["week"], 0), rotation=90, fontsize=6,
                                ha="center", va="bottom", color="tab:red")
    quarantine.set_title("validated rows: in, clean, quarantined (red text: validation "
                         "refused the file)", fontsize=9)
    quarantine.set(xlabel="week", ylabel="rows")
    quarantine.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def two_weeks_summary(fig: dict[str, Any]) -> str:
    """The two-week run's printout of `simulate.two_weeks`'s figures."""
    lines = [f"world: {fig['world']['dir']} ({fig['world']['train_rows_week1']} train rows in "
             f"week 1, {fig['world']['held_back']} held back for week 2)"]
    for n, week in enumerate(fig["weeks"], start=1):
        d = week["decision"]
        lines += [f"\n== week {n}: flow run {week['flow_run_id']} {week['state']}, "
                  f"{week['flow_run_seconds']:.0f} s ({week['script_wall_seconds']:.0f} s with "
                  f"deploy and worker); decision {'GO' if d['go'] else 'NO-GO'}",
                  *(f"   {s}: {'; '.join(why)}" for s, why in week["why"].items())]
        if not week["why"]:
            lines.append("   no stage ran (every one came from the deployment's storage)")
        if n == 1:
            st = fig["steward"]
            lines += ["\n== steward (apply-audit)" + (f": {st['note']}" if st["note"] else ""),
                      *(f"   {d['decision']} {d['key']} ({d.get('tier') or 'clean row'}): gold "
                        f"{d['golden_answers']}"
                        + (f" -> {d['corrected_answers']}" if d["decision"] == "correct" else "")
                        for d in st["decisions"]),
                      f"   overrides added: {st['apply_audit']['added']}",
                      f"== new data: {len(fig['data_changes']['rows_added'])} train rows added, "
                      f"passages changed: {fig['data_changes']['passages_changed']}"]
    m = fig["reached_the_model"]
    lines += ["\n== the correction reached the model",
              f"   week 2 train split, {m['corrected_id']}: {m['week2_train_answers']} "
              f"(corrected: {m['corrected_in_train_split']}); in week 2's curriculum: "
              f"{m['week2_curriculum']}",
              f"   cold start rebuilt: {m['cold_start_rebuilt']}; training re-ran: "
              f"{m['training_reran']}; old checkpoints moved aside: {m['superseded_checkpoints']}"]
    dr = fig["drift"]
    lines += [f"\n== drift (week 2's audit) vs {dr['reference']}",
              *(f"   {name}: {v['old']} -> {v['new']} rows, +{v['added']} -{v['removed']} "
                f"~{v['changed']}" for name, v in dr.get("sets", {}).items()),
              *(f"   warning: {w}" for w in dr.get("warnings", []))]
    for label, key in (("registry after week 2", "registry_after_week2"),
                       ("registry after rollback", "registry_after_rollback")):
        reg = fig[key]
        lines.append(f"\n== {label} ({reg['model']}): " + ", ".join(
            f"{a}=v{v['version']} ({v['decision']})" if v else f"{a}=none"
            for a, v in reg.items() if a != "model"))
        if key == "registry_after_week2":
            lines += [f"   week 2 decision reason: {r}"
                      for r in fig["weeks"][1]["decision"]["reasons"]]
            rb = fig["rollback"]
            lines.append(f"== rollback: {rb['result'] if rb['done'] else rb['message']}")
    pf = fig["prefect"]
    lines += [f"\n== Prefect artifacts ({pf['artifact_key']})",
              *(f"   {w}: {a['headline']}" for w, a in pf["artifacts"].items()),
              "== Prefect events",
              *(f"   {w}: {e}" for w, evs in pf["events"].items() for e in evs),
              f"\nweek 2 / week 1 flow-run time: {fig['week2_over_week1']:.2f}"]
    return "\n".join(lines)
