"""Each system keeps one colour in every plot of the go/no-go report (issue 25, item 3b)."""

from __future__ import annotations

import dataclasses

from matplotlib.colors import to_hex

from searchrl.eval.metrics import breakdown, by_hops
from searchrl.gate.render import PLOTS, ReportInputs
from searchrl.plots import SYSTEM_COLORS, system_colors
from tests.unit.test_report_render import _report, _results


def _bar_colours(report: ReportInputs) -> dict[str, dict[str, set[str]]]:
    """plot -> system -> the face colours of its bars (by legend label, or by x tick for the
    one-bar-per-system plot)."""
    out: dict[str, dict[str, set[str]]] = {}
    for plot, (_, make) in PLOTS.items():
        ax = make(report).axes[0]
        seen: dict[str, set[str]] = {}
        for container in ax.containers:
            label = container.get_label()
            if label and not label.startswith("_"):
                seen.setdefault(label, set()).update(to_hex(b.get_facecolor()) for b in container)
        if plot == "em_by_system":
            ticks = [t.get_text() for t in ax.get_yticklabels()]  # one bar row per system
            for name, bar in zip(ticks, ax.patches, strict=True):
                seen.setdefault(name, set()).add(to_hex(bar.get_facecolor()))
        if seen:
            out[plot] = seen
    return out


def test_a_system_has_one_colour_across_plots_showing_different_subsets() -> None:
    report = _report(go=True)
    # The confidence plot shows only the agentic systems: positional colours shifted there.
    agentic = {n: breakdown(_results(0.5), by_hops, samples=20) for n in ("sft", "trained")}
    report = dataclasses.replace(report, by_confidence=agentic)
    colours = _bar_colours(report)
    assert {"em_by_system", "em_by_hops", "em_by_confidence"} <= set(colours)
    for system in ("no_search", "sft", "trained"):
        used = set().union(*(c[system] for c in colours.values() if system in c))
        assert used == {to_hex(SYSTEM_COLORS[system])}, (system, colours)


def test_system_colours_pin_known_names_and_give_others_distinct_spares() -> None:
    colours = system_colors(["zeta", "trained", "alpha", "sft", "zeta"])
    assert colours["trained"] == SYSTEM_COLORS["trained"] and colours["sft"] == SYSTEM_COLORS["sft"]
    assert len(set(colours.values())) == 4
    assert {colours["zeta"], colours["alpha"]}.isdisjoint(SYSTEM_COLORS.values())
    assert len(set(SYSTEM_COLORS.values())) == len(SYSTEM_COLORS)
