"""The decision report: Markdown/HTML carry the decision and numbers; headless Chromium opens
the HTML and every inline plot decodes to a real image."""

from __future__ import annotations

import base64
import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from searchrl.eval.metrics import (
    QuestionResult,
    breakdown,
    by_hops,
    by_searched,
    by_type,
    paired_bootstrap_delta,
    summarize,
)
from searchrl.gate.payback import CostInputs, GateInputs, GateThresholds, decide
from searchrl.gate.render import PLOTS, ReportInputs, render_figures, render_html, render_markdown

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _results(acc: float, n: int = 40, searches: int = 1) -> list[QuestionResult]:
    return [QuestionResult(example_id=f"q{i}", hops=1 + i % 3, qtype=f"t{i % 2}",
                           em=float(i < acc * n), f1=float(i < acc * n),
                           searches=searches * (i % 4 != 0), format_ok=True, prompt_tokens=50,
                           response_tokens=30, latency_s=0.01, answered=True,
                           finish_reason="answer", retrieved_support=i % 2 == 0)
            for i in range(n)]


def _report(go: bool, costs_ok: bool = True) -> ReportInputs:
    runs = {"no_search": _results(0.1, searches=0), "sft": _results(0.3),
            "trained": _results(0.7 if go else 0.32, searches=2)}
    costs = CostInputs(gpu_type="H100 <x>", gpu_price_per_hour=2.0,
                       training_gpu_hours=10.0 if costs_ok else float("nan"),
                       production_queries_per_month=1e5, small_tokens_per_query=80,
                       small_price_per_1k_tokens=0.0002, frontier_tokens_per_query=1500,
                       frontier_price_per_1k_tokens=0.01)
    deltas = {n: paired_bootstrap_delta([r.em for r in runs["trained"]], [r.em for r in v],
                                        samples=200) for n, v in runs.items() if n != "trained"}
    thresholds = GateThresholds(min_gold_pairs=100, min_accuracy_margin=0.05,
                                max_payback_months=6)
    gate = decide(GateInputs(gold_pairs=500, accuracy_delta=deltas["sft"].mean,
                             accuracy_delta_lo=deltas["sft"].lo,
                             accuracy_delta_hi=deltas["sft"].hi, comparison_baseline="sft",
                             costs=costs, comparator="frontier"), thresholds)
    return ReportInputs(
        title="searchrl decision", gate=gate, thresholds=thresholds, costs=costs,
        gold_pairs=500, comparison_baseline="sft", trained_name="trained", eval_set="test",
        systems={n: summarize(v, samples=200) for n, v in runs.items()},
        by_hops={n: breakdown(v, by_hops, samples=50) for n, v in runs.items()},
        by_type={"trained": breakdown(runs["trained"], by_type, samples=50)},
        searched_split={"trained": breakdown(runs["trained"], by_searched, samples=50)},
        deltas=deltas, training_curve={"reward_mean": [(i, i / 10) for i in range(10)]},
        suspects=[{"example_id": "q9", "question": "Who founded <Acme>?",
                   "golden_answers": ["Bob"], "answer": "Rob", "confidence": 0.9}],
    )


def test_markdown_names_decision_conditions_and_numbers() -> None:
    r = _report(go=True)
    assert r.gate.go
    md = render_markdown(r)
    assert "Decision: **GO**" in md
    for name in ("data", "accuracy", "payback"):
        assert f"PASS {name}:" in md
    assert f"{r.systems['trained'].em.mean:.3f}" in md
    assert "q9" in md and "1 suspect gold labels" in md
    no = render_markdown(_report(go=False))
    assert "Decision: **NO-GO**" in no and "FAIL accuracy:" in no


def test_html_is_self_contained_and_escaped() -> None:
    page = render_html(_report(go=False, costs_ok=False))
    assert 'class="decision nogo">NO-GO<' in page
    assert "FAIL <b>payback</b>" in page and "training_gpu_hours" in page
    assert "&lt;Acme&gt;" in page and "<Acme>" not in page
    assert not re.search(r"(src|href)=\"(https?:|//|file:)", page)
    assert page.count('src="data:image/png;base64,') == len(PLOTS)


def test_figures_are_pngs() -> None:
    figs = render_figures(_report(go=True, costs_ok=False))
    assert set(figs) == set(PLOTS)
    for data in figs.values():
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_em_by_system_plot_labels_never_overlap() -> None:
    """Issue 43: under vertical bars, seven system names overlapped one another."""
    from searchrl.gate.render import _plot_em_by_system

    names = ["scripted", "no_search", "retrieve_once", "sft", "rejection_sampling",
             "base_agentic", "champion", "trained"]
    base = _report(go=True)
    report = dataclasses.replace(base, systems={n: base.systems["sft"] for n in names})
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _plot_em_by_system(report)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    bars = fig.axes[0]
    renderer = canvas.get_renderer()
    values = fig.axes[1]  # the EM of each system, right of the plot
    labels = [t for t in bars.get_yticklabels() + bars.get_xticklabels()
              + values.get_yticklabels() if t.get_text()]
    assert {t.get_text() for t in labels} >= set(names) | {"0.300"}  # names and values
    # No label sits on a bar (a value drawn inside the plot hid behind scripted's 0.96 bar).
    plot = bars.get_window_extent(renderer)
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), "two axis labels overlap"
    inside = fig.bbox
    assert all(inside.x0 <= b.x0 and b.x1 <= inside.x1 for b in boxes)  # none cut off
    assert not any(plot.x0 < (b.x0 + b.x1) / 2 < plot.x1 and plot.y0 < (b.y0 + b.y1) / 2
                   < plot.y1 for b in boxes)


def test_eval_sets_side_by_side_in_markdown_and_html() -> None:
    r = _report(go=True)
    hotpot = {"no_search": _results(0.0, n=10, searches=0), "sft": _results(0.2, n=10),
              "trained": _results(0.5, n=10)}
    r = dataclasses.replace(r, main_split="test", eval_columns={
        "test": r.systems,
        "hotpotqa": {n: summarize(v, samples=100) for n, v in hotpot.items()},
        "bamboogle": {"trained": summarize(_results(0.25, n=8), samples=100)}})
    md = render_markdown(r)
    # EM on test (40 questions): 0.1 / 0.3 / 0.7; on hotpotqa (10): 0.0 / 0.2 / 0.5; the
    # average needs every set, so only the trained row (also on bamboogle, 2/8) has one.
    assert "| system | test (main) | hotpotqa | bamboogle | average |" in md
    assert "| trained | 0.700 (n=40) | 0.500 (n=10) | 0.250 (n=8) | 0.483 |" in md
    assert "| sft | 0.300 (n=40) | 0.200 (n=10) | n/a | n/a |" in md
    assert "accuracy condition uses the main split, test" in md
    page = render_html(r, figures={})
    assert ("<tr><td>trained</td><td>0.700 (n=40)</td><td>0.500 (n=10)</td>"
            "<td>0.250 (n=8)</td><td>0.483</td></tr>") in page
    assert "<th>test (main)</th><th>hotpotqa</th><th>bamboogle</th><th>average</th>" in page
    two = dataclasses.replace(r, eval_columns={k: v for k, v in r.eval_columns.items()
                                               if k != "bamboogle"})
    assert "| no_search | 0.100 (n=40) | 0.000 (n=10) | 0.050 |" in render_markdown(two)


def test_the_decision_box_lists_every_system_and_says_a_warning_first() -> None:
    r = dataclasses.replace(
        _report(go=True), system_roles={"sft": "fine-tuned, no RL"}, not_evaluated=("frontier",),
        scripted="WARNING: the scripted baseline <beats> the trained policy",
        scripted_warning=True, provenance="How the recipe was chosen: CAVEAT: not sealed",
        comparator="Comparator: sft")
    head = render_markdown(r).split("\n## ")[0]
    assert head.index("**WARNING: the scripted") < head.index("**Comparator: sft**")
    assert head.index("**Comparator: sft**") < head.index("| system | what it is |")
    assert "| no_search |  | 40 | 0.100 [" in head
    assert "| sft | fine-tuned, no RL; THE COMPARATOR | 40 | 0.300 [" in head
    assert "| trained |  | 40 | 0.700 [" in head and "|  | 1.50 | 1.00 |" in head
    assert "| frontier |  |  | not evaluated (see the notes) |  |  |  |" in head
    page = render_html(r, figures={})
    assert '<p id="scripted" class="fail"><b>WARNING: the scripted baseline &lt;beats&gt;' in page
    assert '<p id="provenance" class="fail">' in page
    assert page.index('id="scripted"') < page.index('id="decision-systems"')
    sealed = render_html(dataclasses.replace(r, sealed=True, scripted_warning=False),
                         figures={})
    assert '<p id="provenance"><b>' in sealed and '<p id="scripted"><b>' in sealed


_PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = Array.from(document.querySelectorAll('img'));
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100);
  const probe = document.createElement('div');
  probe.id = 'probe';
  probe.textContent = `rendered=${ok.length} total=${imgs.length} ` +
    `decision=${document.getElementById('decision').innerText}`;
  document.body.appendChild(probe);
});
</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
@pytest.mark.parametrize("go", [True, False])
def test_headless_chromium_renders_decision_and_plots(tmp_path: Path, go: bool) -> None:
    r = _report(go=go)
    # The probe is injected into a copy: the report itself carries no script.
    page = tmp_path / "report.html"
    page.write_text(render_html(r).replace("</body>", _PROBE))
    assert CHROMIUM is not None
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    match = re.search(r'<div id="probe">rendered=(\d+) total=(\d+) decision=([A-Z-]+)</div>',
                      out.stdout)
    assert match, out.stdout[-2000:]
    assert int(match.group(1)) == int(match.group(2)) == len(PLOTS)
    assert match.group(3) == r.gate.label == ("GO" if go else "NO-GO")
