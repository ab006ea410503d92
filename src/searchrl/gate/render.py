"""The decision report: one self-contained HTML page (plots inline as base64 PNG) and the same
numbers as Markdown. Pure: inputs in, strings out; the caller writes and logs them.

Plots are drawn with `matplotlib.figure.Figure` directly (no pyplot, no global backend state),
so rendering is safe in Prefect worker threads.

Over 400 lines because it is the one renderer of the report: every table and plot, the Markdown
and the HTML drawn from the same rows.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure

from searchrl.eval.audit import (
    GOLD_LIKELY_WRONG,
    GOLD_POSSIBLY_WRONG,
    POLICY_ERROR,
    TIER_RULES,
    TIERS,
)
from searchrl.eval.metrics import NO_HITS, NO_SEARCH, Interval, Summary
from searchrl.gate.payback import (
    CostInputs,
    GateResult,
    GateThresholds,
    Projection,
    StageCost,
    payback_curve,
)
from searchrl.gate.slices import Slice, SliceReport
from searchrl.plots import figure_png_base64, system_colors
from searchrl.tables import html_table, markdown_table


@dataclass(frozen=True)
class ReportInputs:
    """Everything the report shows. `systems` is in display order and contains `trained_name`;
    `deltas` are paired EM deltas (trained minus each baseline). `eval_columns` is eval set ->
    system -> summary (the main split `main_split` first); `stage_costs` are the measured
    stages, `projection` their training scaled to the full run, `cost_basis` says what the
    payback condition charged."""

    title: str
    gate: GateResult
    thresholds: GateThresholds
    costs: CostInputs
    gold_pairs: int | None
    comparison_baseline: str
    trained_name: str
    eval_set: str
    systems: dict[str, Summary]
    by_hops: dict[str, dict[str, Summary]]
    by_type: dict[str, dict[str, Summary]]
    searched_split: dict[str, dict[str, Summary]]
    deltas: dict[str, Interval]
    training_curve: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    suspects: list[dict[str, Any]] = field(default_factory=list)
    payback_horizon_months: int = 24
    notes: tuple[str, ...] = ()
    eval_columns: dict[str, dict[str, Summary]] = field(default_factory=dict)
    main_split: str = "test"
    stage_costs: tuple[StageCost, ...] = ()
    projection: Projection | None = None
    device_unit: str = "GPU-hours"
    cost_basis: str = ""
    # The decision box: what the accuracy condition compared with (the frontier system, or a
    # stand-in named as such) and which checkpoint of the run was evaluated (best or last).
    comparator: str = ""
    policy_selection: str = ""
    # The decision box too: steps that updated the policy and those skipped, or that
    # training changed nothing (gate.report.TrainingSteps.sentence); "" when not known.
    training: str = ""
    # The decision box: the non-inferiority condition against the registry's champion, and
    # what training started from (train.init).
    champion: str = ""
    start: str = ""
    frontier_tokens_source: str = "assumed"
    # Eval split by the first search's top-1 retriever score (metrics.by_confidence) with the
    # tercile cut points; the label-noise audit of sampled train questions (0: not run).
    by_confidence: dict[str, dict[str, Summary]] = field(default_factory=dict)
    confidence_cuts: tuple[float, float] | None = None
    train_suspects: list[dict[str, Any]] = field(default_factory=list)
    train_audit_questions: int = 0
    # Per hop count, question type and named slice vs the comparator and champion
    # (gate.slices); its zero-EM slices and regressions are also said in the decision box.
    slices: SliceReport | None = None
    # The decision box: what each system is (name -> role), the systems asked for but not
    # evaluated, the trained policy against the scripted baseline (`scripted_warning`: the
    # script matches or beats it, said first), and how the recipe was chosen (`sealed`: the
    # world was read by no tuning; else the text is a caveat).
    system_roles: dict[str, str] = field(default_factory=dict)
    not_evaluated: tuple[str, ...] = ()
    scripted: str = ""
    scripted_warning: bool = False
    provenance: str = ""
    sealed: bool = False
    # The world card: (named slice, questions in it, what it tests).
    world_card: tuple[tuple[str, int, str], ...] = ()


# --- formatting


def _num(x: float | None, fmt: str = ".3f") -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return format(x, fmt)


def _ci(iv: Interval, fmt: str = ".3f") -> str:
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "n/a"
    return f"{iv.mean:{fmt}} [{iv.lo:{fmt}}, {iv.hi:{fmt}}]"


def _signed_ci(iv: Interval) -> str:
    return _ci(iv, "+.3f")


def _system_rows(systems: dict[str, Summary]) -> list[list[str]]:
    return [[name, str(s.n), _ci(s.em), _num(s.f1.mean), _num(s.searches_per_question, ".2f"),
             _num(s.format_rate, ".2f"), _num(s.support_recall, ".2f"),
             _num(s.tokens_per_query, ".0f"), _num(s.latency_s * 1000, ".0f")]
            for name, s in systems.items()]


SYSTEM_HEADER = ("system", "n", "EM [95% CI]", "F1", "searches/q", "format ok",
                 "support retrieved", "tokens/query", "latency ms/q")


BOX_HEADER = ("system", "what it is", "n", "EM [95% CI]", "trained - it [95% CI]",
              "searches/q", "format ok")


def _box_rows(r: ReportInputs) -> list[list[str]]:
    """The decision box's table: every evaluated system side by side in display order (EM
    with its interval, the paired delta of the trained policy against it, searches per
    question, format-ok rate), then those asked for but not evaluated."""
    rows = []
    for name, s in r.systems.items():
        role = r.system_roles.get(name, "")
        if name == r.comparison_baseline:
            role = f"{role}; THE COMPARATOR" if role else "THE COMPARATOR"
        delta = r.deltas.get(name)
        rows.append([name, role, str(s.n), _ci(s.em),
                     "" if name == r.trained_name else
                     _signed_ci(delta) if delta is not None else "n/a",
                     _num(s.searches_per_question, ".2f"), _num(s.format_rate, ".2f")])
    rows += [[name, r.system_roles.get(name, ""), "", "not evaluated (see the notes)", "", "",
              ""] for name in r.not_evaluated]
    return rows


def _group_rows(groups: dict[str, dict[str, Summary]]) -> list[list[str]]:
    return [[system, group, str(s.n), _ci(s.em), _num(s.searches_per_question, ".2f")]
            for system, by_group in groups.items() for group, s in by_group.items()]


def _eval_set_table(r: ReportInputs) -> tuple[list[str], list[list[str]]]:
    """Search-R1 Table 2's layout: systems x eval sets, EM (n), and the unweighted average
    over the sets (n/a unless the system has a finite EM on every set)."""
    sets = list(r.eval_columns)
    header = ["system", *[f"{s} (main)" if s == r.main_split else s for s in sets], "average"]
    systems = list(dict.fromkeys(n for col in r.eval_columns.values() for n in col))
    rows = []
    for name in systems:
        ems = [r.eval_columns[s][name].em if name in r.eval_columns[s] else None for s in sets]
        cells = [f"{_num(iv.mean)} (n={iv.n})" if iv is not None else "n/a" for iv in ems]
        finite = [iv.mean for iv in ems if iv is not None and math.isfinite(iv.mean)]
        avg = sum(finite) / len(finite) if len(finite) == len(sets) else math.nan
        rows.append([name, *cells, _num(avg)])
    return header, rows


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "not recorded"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


def _stage_rows(r: ReportInputs) -> list[list[str]]:
    price = r.costs.gpu_price_per_hour
    price = price if price is not None and math.isfinite(price) else math.nan

    def row(stage: str, wall: str, devices: str, hours: float) -> list[str]:
        return [stage, wall, devices, _num(hours, ".4f"), _num(hours * price, ",.2f")]

    rows = [row(s.stage, _duration(s.seconds), str(s.devices), s.device_hours)
            for s in r.stage_costs]
    p = r.projection
    if p is not None:
        rows.append(row(f"training, projected to the full run (x{_num(p.ratio, '.2f')} by "
                        f"{p.basis})", "", "", p.projected_device_hours))
    if r.stage_costs:
        charged = r.costs.training_gpu_hours
        rows.append(row("charged by the payback condition", "", "",
                        charged if charged is not None else math.nan))
    return rows


def _projection_rows(r: ReportInputs) -> list[list[str]]:
    p = r.projection
    if p is None:
        return []
    return [[f"prototype training {p.basis}", _num(p.done, ",.0f")],
            [f"full run {p.basis} (configured)", _num(p.full, ",.0f")],
            ["projection ratio (full / prototype)", _num(p.ratio, ".2f")],
            [f"training {r.device_unit}, measured", _num(p.measured_device_hours, ".4f")],
            [f"training {r.device_unit}, projected", _num(p.projected_device_hours, ".4f")]]


def _cost_rows(r: ReportInputs) -> list[list[str]]:
    c, p = r.costs, r.gate.payback
    rows = [["GPU type", c.gpu_type],
            ["price per device per hour", _num(c.gpu_price_per_hour, ".2f")],
            *_projection_rows(r),
            [f"{r.device_unit} charged", _num(c.training_gpu_hours, ".4f")],
            ["production queries / month", _num(c.production_queries_per_month, ",.0f")],
            ["trained model tokens / query (measured)", _num(c.small_tokens_per_query, ".0f")],
            ["trained model price / 1k tokens", _num(c.small_price_per_1k_tokens, ".5f")],
            [f"frontier tokens / query ({r.frontier_tokens_source})",
             _num(c.frontier_tokens_per_query, ".0f")],
            ["frontier price / 1k tokens", _num(c.frontier_price_per_1k_tokens, ".5f")]]
    if p is not None:
        rows += [["training cost (charged hours x price)", _num(p.training_cost, ",.2f")],
                 ["trained model cost / month", _num(p.small_monthly_cost, ",.2f")],
                 ["frontier cost / month", _num(p.frontier_monthly_cost, ",.2f")],
                 ["monthly saving", _num(p.monthly_saving, ",.2f")],
                 ["payback months", _num(p.payback_months, ".3f")]]
    return rows


# Rows shown per tier: the steward works the first tier; the others are for spot checks.
TIER_LIMITS = {GOLD_LIKELY_WRONG: 25, GOLD_POSSIBLY_WRONG: 15, POLICY_ERROR: 10}
TIER_NAMES = {GOLD_LIKELY_WRONG: "gold likely wrong", GOLD_POSSIBLY_WRONG: "gold possibly wrong",
              POLICY_ERROR: "policy error"}
SUSPECT_HEADER = ["rank", "key", "question", "gold", "policy answer", "score", "confidence",
                  "answer in passage (evidence)", "gold in passage", "flagged by"]


def _tier(s: dict[str, Any]) -> str:
    # Rows written before the audit had tiers carry no evidence either way.
    return str(s.get("tier") or GOLD_POSSIBLY_WRONG)


def _suspect_rows(suspects: Sequence[dict[str, Any]], limit: int = 25) -> list[list[str]]:
    def cut(text: object, n: int = 240) -> str:
        t = str(text or "")
        return t if len(t) <= n else t[:n] + "..."

    return [[str(i), str(s.get("key", s.get("example_id", ""))),
             cut(s.get("question")), " / ".join(s.get("golden_answers", [])),
             cut(s.get("answer")), _num(s.get("score", s.get("confidence")), ".2f"),
             _num(s.get("confidence"), ".2f"),
             f"{s.get('answer_doc')}: {cut(s.get('answer_snippet'))}"
             if s.get("answer_doc") else "no" if "answer_doc" in s
             else "yes" if s.get("answer_in_support") else "no",
             f"{s.get('gold_doc')}: {cut(s.get('gold_snippet'))}" if s.get("gold_doc")
             else "unknown" if s.get("gold_in_support") is None else "no",
             ", ".join(s.get("flagged_by", []))]
            for i, s in enumerate(suspects[:limit], start=1)]


def _audit_sections(r: ReportInputs) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """A count per tier, then each tier's ranked rows, for the eval set and the train sample."""
    sets = [("eval", f"{r.main_split} (all questions)", r.suspects)]
    if r.train_audit_questions:
        sets.append(("train", f"train ({r.train_audit_questions} sampled questions)",
                     r.train_suspects))
    counts = [[label, TIER_NAMES[t], TIER_RULES[t],
               str(sum(1 for s in rows if _tier(s) == t))]
              for _, label, rows in sets for t in TIERS]
    likely = sum(1 for s in r.suspects if _tier(s) == GOLD_LIKELY_WRONG)
    out = [("audit", f"Label-noise audit: {len(r.suspects)} suspect gold labels, {likely} "
                     "gold likely wrong (decide in suspect_labels*.jsonl, then "
                     "`python -m searchrl apply-audit --decisions FILE`)",
            ["set", "tier", "rule", "suspects"], counts)]
    for name, label, rows in sets:
        for t in TIERS:
            in_tier = [s for s in rows if _tier(s) == t]
            shown = min(len(in_tier), TIER_LIMITS[t])
            out.append((f"audit-{name}-{t}",
                        f"Audit, {label}: {TIER_NAMES[t]} ({len(in_tier)}, top {shown} by "
                        "score = confidence x agreement)",
                        SUSPECT_HEADER, _suspect_rows(in_tier, TIER_LIMITS[t])))
    return out


_BUCKET_NAMES = {NO_SEARCH: "no search", NO_HITS: "first search returned nothing",
                 "q1_low": "low", "q2_mid": "mid", "q3_high": "high"}


def _confidence_rows(r: ReportInputs) -> list[list[str]]:
    lo, hi = r.confidence_cuts or (math.nan, math.nan)
    ranges = {"q1_low": f"<= {_num(lo, '.4g')}",
              "q2_mid": f"({_num(lo, '.4g')}, {_num(hi, '.4g')}]",
              "q3_high": f"> {_num(hi, '.4g')}"}
    return [[system, _BUCKET_NAMES.get(b, b), ranges.get(b, ""), str(s.n), _ci(s.em),
             _num(s.searches_per_question, ".2f")]
            for system, groups in r.by_confidence.items() for b, s in groups.items()]


def _slice_verdict(sl: Slice, claim: int) -> str:
    """A slice under `claim` questions is "too few to claim" and never a win, whatever its
    interval; a regression is marked on any slice it was flagged on."""
    marks = [f"too few to claim (n < {claim})"] * sl.too_few_to_claim
    marks += [f"win vs {d.against}" for d in sl.wins if not sl.too_few_to_claim]
    marks += [f"REGRESSION vs {d.against}" for d in sl.regressions]
    marks += ["ZERO"] * sl.zero
    return ", ".join(marks) or "no significant difference"


def _slice_table(r: ReportInputs) -> tuple[str, list[str], list[list[str]]]:
    """(heading, header, rows): each slice's n, trained EM with its interval and, per
    compared system (the comparator first), its EM and the paired delta; the verdict says
    win / regression / zero / too few to claim."""
    s = r.slices
    if s is None:
        return "Slices: not computed", ["slice"], []
    header = ["slice", "n", f"{r.trained_name} EM [{s.level:.0%} CI]"]
    for name in s.against:
        header += [f"{name} EM", f"delta vs {name} [{s.level:.0%} CI]"]
    rows = []
    for sl in s.slices:
        row = [sl.label, str(sl.n), f"{_ci(sl.trained_ci)} ({sl.correct}/{sl.n})"]
        for d in sl.vs:
            row += [_num(d.em), f"{_signed_ci(d.delta)} (n={d.delta.n})"]
        rows.append([*row, _slice_verdict(sl, s.claim_min_questions)])
    header.append("verdict")
    heading = (f"Slices: {r.trained_name} per hop count, question type and named slice, "
               f"paired EM deltas; a win needs the interval above 0 on >= "
               f"{s.claim_min_questions} questions (gate.slice_claim_min_questions; fewer: too "
               f"few to claim, never a win); a regression is an interval entirely below 0 on "
               f">= {s.min_questions} questions and gate.slice_regression={s.mode} "
               + ("fails the gate on one" if s.mode == "fail" else "only marks it")
               + (f"; {s.note}" if s.note else ""))
    return heading, header, rows


def _world_card_rows(r: ReportInputs) -> list[list[str]]:
    return [[name, str(n), text] for name, n, text in r.world_card]


# --- plots


def _placeholder(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _colors(r: ReportInputs) -> dict[str, str]:
    """One colour per system for every plot of the report (searchrl.plots.system_colors)."""
    return system_colors([*r.systems, *r.by_hops, *r.by_confidence])


def _plot_em_by_system(r: ReportInputs) -> Figure:
    """Horizontal bars, one row per system: names such as `rejection_sampling` beside
    `retrieve_once` overlapped as labels under vertical bars."""
    names = list(r.systems)
    fig = Figure(figsize=(6, 1.2 + 0.38 * max(len(names), 1)), layout="constrained")
    ax = fig.subplots()
    means = [r.systems[n].em.mean for n in names]
    lows = [max(0.0, m - r.systems[n].em.lo) if math.isfinite(m) else 0 for n, m in
            zip(names, means, strict=True)]
    highs = [max(0.0, r.systems[n].em.hi - m) if math.isfinite(m) else 0 for n, m in
             zip(names, means, strict=True)]
    colors = [_colors(r)[n] for n in names]
    rows = list(range(len(names)))
    ax.barh(rows, [m if math.isfinite(m) else 0 for m in means], xerr=[lows, highs],
            capsize=3, color=colors)
    ax.set_yticks(rows, names)
    ax.invert_yaxis()  # the systems top to bottom in the report's order
    ax.set_xlabel("exact match")
    ax.set_xlim(0, 1)
    # Each EM as a label outside the plot, on the right: inside it, a bar near 1 hid it.
    values = ax.twinx()
    values.set_ylim(ax.get_ylim())
    values.set_yticks(rows, [f"{m:.3f}" if math.isfinite(m) else "n/a" for m in means])
    values.tick_params(axis="y", length=0)
    ax.set_title(f"EM by system ({r.eval_set}, 95% bootstrap CI)")
    return fig


def _grouped_bars(ax: Any, groups: dict[str, dict[str, Summary]], value: str,
                  colors: dict[str, str]) -> None:
    systems = list(groups)
    keys = sorted({k for g in groups.values() for k in g})
    width = 0.8 / max(len(systems), 1)
    for i, system in enumerate(systems):
        vals = []
        for k in keys:
            s = groups[system].get(k)
            v = (s.em.mean if value == "em" else s.searches_per_question) if s else math.nan
            vals.append(v if math.isfinite(v) else 0.0)
        ax.bar([j + i * width for j in range(len(keys))], vals, width=width, label=system,
               color=colors[system])
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(keys))], keys)
    ax.legend(fontsize=7)


def _bars_figure(groups: dict[str, dict[str, Summary]], value: str, ylabel: str, title: str,
                 empty: str, colors: dict[str, str]) -> Figure:
    """Grouped bars of `value` per system and group (a placeholder when there are none)."""
    fig = Figure(figsize=(6, 3.2))
    ax = fig.subplots()
    if not groups:
        _placeholder(ax, empty)
    else:
        _grouped_bars(ax, groups, value, colors)
        ax.set_ylabel(ylabel)
        if value == "em":
            ax.set_ylim(0, 1)
    ax.set_title(title)
    return fig


def _plot_em_by_hops(r: ReportInputs) -> Figure:
    return _bars_figure(r.by_hops, "em", "exact match", "EM by hop count", "no results",
                        _colors(r))


def _plot_searches(r: ReportInputs) -> Figure:
    return _bars_figure(r.by_hops, "searches", "searches per question",
                        "Searches per question by hop count", "no results", _colors(r))


def _plot_em_by_confidence(r: ReportInputs) -> Figure:
    return _bars_figure(r.by_confidence, "em", "exact match",
                        "EM by retrieval confidence (first search's top-1 score)",
                        "no retrieval scores recorded", _colors(r))


def _plot_training(r: ReportInputs) -> Figure:
    fig = Figure(figsize=(6, 3.2))
    ax = fig.subplots()
    if not any(r.training_curve.values()):
        _placeholder(ax, "no training metrics recorded")
    for name, points in r.training_curve.items():
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=name)
    if any(r.training_curve.values()):
        ax.set_xlabel("GRPO step")
        ax.legend(fontsize=7)
    ax.set_title("Training curve")
    return fig


def _plot_payback(r: ReportInputs) -> Figure:
    fig = Figure(figsize=(6, 3.2))
    ax = fig.subplots()
    p = r.gate.payback
    if p is None:
        _placeholder(ax, "cost model inputs invalid: no payback curve")
    else:
        curve = payback_curve(p, r.payback_horizon_months)
        ax.plot([m for m, _ in curve], [v for _, v in curve], marker=".")
        ax.axhline(0.0, color="grey", linewidth=0.8)
        limit = r.thresholds.max_payback_months
        if math.isfinite(limit):
            ax.axvline(limit, color="tab:red", linestyle="--", label=f"max payback {limit:g} mo")
            ax.legend(fontsize=7)
        ax.set_xlabel("months in production")
        ax.set_ylabel("cumulative net saving")
    ax.set_title("Payback curve")
    return fig


PLOTS = {
    "em_by_system": ("EM by system with 95% intervals", _plot_em_by_system),
    "em_by_hops": ("EM by hop count", _plot_em_by_hops),
    "searches_per_question": ("Searches per question", _plot_searches),
    "training_curve": ("Training curve", _plot_training),
    "payback_curve": ("Payback curve", _plot_payback),
    "em_by_confidence": ("EM by retrieval confidence", _plot_em_by_confidence),
}


def render_figures(r: ReportInputs) -> dict[str, str]:
    """Plot name -> base64 PNG."""
    return {name: figure_png_base64(make(r)) for name, (_, make) in PLOTS.items()}


# --- documents


def _sections(r: ReportInputs) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """(anchor, heading, table header, rows) shared by Markdown and HTML."""
    delta_rows = [[f"{r.trained_name} - {name}", _signed_ci(iv), str(iv.n)]
                  for name, iv in r.deltas.items()]
    set_header, set_rows = _eval_set_table(r)
    slice_heading, slice_header, slice_rows = _slice_table(r)
    return [
        ("systems", f"Systems on the eval set ({r.main_split}, main)", list(SYSTEM_HEADER),
         _system_rows(r.systems)),
        ("eval-sets", f"EM by eval set (the accuracy condition uses the main split, "
                      f"{r.main_split}; each set is searched in its own corpus)",
         set_header, set_rows),
        ("deltas", f"Paired EM deltas ({r.trained_name} minus baseline)",
         ["comparison", "EM delta [95% CI]", "paired n"], delta_rows),
        ("hops", "By hop count", ["system", "hops", "n", "EM [95% CI]", "searches/q"],
         _group_rows(r.by_hops)),
        ("searched", "Searched vs answered without searching",
         ["system", "route", "n", "EM [95% CI]", "searches/q"], _group_rows(r.searched_split)),
        ("types", "By question type", ["system", "type", "n", "EM [95% CI]", "searches/q"],
         _group_rows(r.by_type)),
        ("world-card", "World card: what each named slice of the eval questions tests",
         ["slice", "questions", "what it tests"], _world_card_rows(r)),
        ("slices", slice_heading, slice_header, slice_rows),
        ("stage-costs", f"Compute by stage: {r.device_unit} = wall time x devices",
         ["stage", "wall time", "devices", r.device_unit, "cost"], _stage_rows(r)),
        ("costs", "Cost model", ["item", "value"], _cost_rows(r)),
        ("confidence", "By retrieval confidence: top-1 retriever score of the first search, "
                       "in terciles of the trained policy's scores on this eval set",
         ["system", "confidence", "score range", "n", "EM [95% CI]", "searches/q"],
         _confidence_rows(r)),
        *_audit_sections(r),
    ]


def _headline(r: ReportInputs) -> list[str]:
    t = r.thresholds
    return [
        f"Decision: **{r.gate.label}**",
        f"Conditions: at least {t.min_gold_pairs} gold pairs; {r.trained_name} beats "
        f"{r.comparison_baseline} on EM on the main split ({r.main_split}) by >= "
        f"{t.min_accuracy_margin:+.3f} with the 95% interval above zero; payback within "
        f"{t.max_payback_months:g} months.",
        r.cost_basis,
    ]


def _slice_sentence(r: ReportInputs) -> str:
    return r.slices.sentence() if r.slices is not None else ""


def _boxed(r: ReportInputs) -> list[tuple[str, str]]:
    """The decision box's statements as (HTML id, text), a scripted warning first."""
    out = [("scripted", r.scripted)] * (r.scripted_warning and bool(r.scripted))
    out += [("comparator", r.comparator), ("provenance", r.provenance),
            ("champion", r.champion), ("train-start", r.start),
            ("policy-selection", r.policy_selection), ("training", r.training),
            ("slices-box", _slice_sentence(r))]
    out += [("scripted", r.scripted)] * (not r.scripted_warning and bool(r.scripted))
    return [(k, text) for k, text in out if text]


def render_markdown(r: ReportInputs) -> str:
    lines = [f"# {r.title}", ""]
    head = _headline(r)
    boxed = _boxed(r)
    lines += [head[0], ""]
    for _, text in boxed:  # each its own paragraph
        lines += [f"**{text}**", ""]
    if r.systems or r.not_evaluated:
        lines += [markdown_table(BOX_HEADER, _box_rows(r)), ""]
    lines += [head[1], ""] + ([head[2], ""] if head[2] else [])
    lines += [f"- {'PASS' if c.passed else 'FAIL'} {c.name}: {c.detail}" for c in r.gate.checks]
    lines += ["", f"Gold pairs available: {r.gold_pairs}; eval set: {r.eval_set}.", ""]
    lines += [f"> {note}" for note in r.notes]
    for _, heading, header, rows in _sections(r):
        lines += ["", f"## {heading}", ""]
        lines.append(markdown_table(header, rows) if rows else "_none_")
    lines.append("")
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}
.decision{font-size:1.6em;font-weight:bold;padding:.4em .8em;display:inline-block;border-radius:6px}
.go{background:#d8f5d8;color:#145214}.nogo{background:#fde0e0;color:#7a1010}
.pass{color:#145214}.fail{color:#7a1010}
figure{display:inline-block;margin:.5em}figcaption{font-size:.85em;color:#555}
"""


def _box_class(r: ReportInputs, key: str) -> str:
    """A decision-box statement that undercuts the result is styled as a failure."""
    warn = ((key == "scripted" and r.scripted_warning)
            or (key == "provenance" and not r.sealed))
    return ' class="fail"' if warn else ""


def render_html(r: ReportInputs, figures: dict[str, str] | None = None) -> str:
    """A self-contained page: no external scripts, styles, fonts or images."""
    figs = figures if figures is not None else render_figures(r)
    esc = html.escape
    klass = "go" if r.gate.go else "nogo"
    checks = "".join(
        f'<li class="{"pass" if c.passed else "fail"}" data-check="{esc(c.name)}">'
        f'{"PASS" if c.passed else "FAIL"} <b>{esc(c.name)}</b>: {esc(c.detail)}</li>'
        for c in r.gate.checks)
    plots = "".join(
        f'<figure><img id="plot-{name}" alt="{esc(caption)}" '
        f'src="data:image/png;base64,{figs[name]}"><figcaption>{esc(caption)}</figcaption>'
        f"</figure>" for name, (caption, _) in PLOTS.items() if name in figs)
    notes = "".join(f"<p><em>{esc(n)}</em></p>" for n in r.notes)
    sections = "".join(f'<h2 id="{a}">{esc(h)}</h2>'
                       + (html_table(hd, rows) if rows else "<p><em>none</em></p>")
                       for a, h, hd, rows in _sections(r))
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(r.title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{esc(r.title)}</h1>"
        f'<div id="decision" class="decision {klass}">{esc(r.gate.label)}</div>'
        + "".join(f'<p id="{k}"{_box_class(r, k)}><b>{esc(text)}</b></p>'
                  for k, text in _boxed(r))
        + (f'<div id="decision-systems">{html_table(BOX_HEADER, _box_rows(r))}</div>'
           if r.systems or r.not_evaluated else "")
        + f"<p>{esc(_headline(r)[1])}</p>"
        + (f'<p id="cost-basis">{esc(r.cost_basis)}</p>' if r.cost_basis else "")
        + f"<ul id=\"checks\">{checks}</ul>"
        f"<p>Gold pairs available: {esc(str(r.gold_pairs))}; eval set: {esc(r.eval_set)}.</p>"
        f"{notes}<h2>Plots</h2>{plots}{sections}</body></html>"
    )
