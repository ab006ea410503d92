"""The gate sees slices: per question type and hop count, a significantly worse trained policy
is marked (paired interval entirely below 0), a slice at EM 0 is named in the decision box,
and gate.slice_regression=fail turns such a regression into a NO-GO naming the slice."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

from searchrl.eval.baselines import TRAINED
from searchrl.eval.metrics import QuestionResult
from searchrl.gate.render import render_html, render_markdown
from searchrl.gate.report import build_gate
from searchrl.gate.slices import Slice, SliceReport, compute_slices
from searchrl.sinks import NullSink
from searchrl.stages import decide_go_no_go
from tests.unit.test_gate_costs import _gate_stage_inputs
from tests.unit.test_gate_report import _config, _eval, _train

# type -> (hops, questions, trained correct, comparator correct): the trained policy wins
# city_capital by far (so the aggregate is a GO), collapses on org_founder (0/10 vs 10/10),
# and loses the 3-question `rare` type, too few to flag.
TYPES = {"city_capital": (1, 40, 40, 10), "org_founder": (2, 10, 0, 10), "rare": (3, 3, 0, 3)}


def _per_question() -> dict[str, list[QuestionResult]]:
    per: dict[str, list[QuestionResult]] = {TRAINED: [], "sft": []}
    for qtype, (hops, n, trained, other) in TYPES.items():
        for name, correct in ((TRAINED, trained), ("sft", other)):
            per[name] += [QuestionResult(
                example_id=f"{qtype}-{i}", hops=hops, qtype=qtype, em=float(i < correct),
                f1=float(i < correct), searches=1, format_ok=True, prompt_tokens=80,
                response_tokens=20, latency_s=0.01, answered=True, finish_reason="answer")
                for i in range(n)]
    return per


def _by_label(report: SliceReport) -> dict[str, Slice]:
    return {s.label: s for s in report.slices}


def test_a_collapsed_type_is_a_regression_with_its_interval_below_zero() -> None:
    per = _per_question()
    report = compute_slices(per[TRAINED], {"sft": per["sft"]}, mode="warn", min_questions=5,
                            samples=500, level=0.95, seed=0)
    slices = _by_label(report)
    founder = slices["type org_founder"]
    (delta,) = founder.regressions
    assert delta.against == "sft" and delta.delta.n == 10
    assert delta.delta.mean == -1.0 and delta.delta.hi < 0.0
    assert founder.zero and founder.trained_em == 0.0 and delta.em == 1.0
    assert not slices["type city_capital"].regressions
    rare = slices["type rare"]
    assert rare.too_few and rare.zero and not rare.regressions
    assert rare.vs[0].delta.hi < 0.0  # below 0, yet unflagged
    assert slices["hops 2-hop"].regressions and not slices["hops 3-hop"].regressions
    assert report.figures() == {"slice_regressions": 2.0, "slices_at_zero": 4.0,
                                "slices": 6.0, "slice_wins": 2.0}
    # The wins: 40/40 vs 10/40 on >= 30 (compute_slices' default claim) questions.
    assert [f"{s.label} vs {d.against}" for s, d in report.wins] == [
        "hops 1-hop vs sft", "type city_capital vs sft"]


def test_warn_keeps_a_go_and_the_decision_box_names_the_zero_slice(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {}, _per_question())
    result, report = build_gate(_config(), ev, gold_pairs=500, stages=_train(3600.0),
                                training_curve={})
    assert result.go, result.reasons
    assert "slices" not in {c.name for c in result.checks}
    md, page = render_markdown(report), render_html(report)
    for text in (md, page):
        assert ("slice scores 0: 2-hop (0/10), 3-hop (0/3), org_founder (0/10), rare (0/3)"
                in text)
        assert "warning only, gate.slice_regression=warn" in text
        assert "type org_founder vs sft -1.000 [-1.000, -1.000] (n=10)" in text
        assert "REGRESSION vs sft" in text and "too few to claim (n &lt; 30)" in text.replace(
            "(n < 30)", "(n &lt; 30)")
    assert 'id="slices-box"' in page and 'id="slices"' in page
    assert ("| type org_founder | 10 | 0.000 [0.000, 0.000] (0/10) | 1.000 | -1.000 [-1.000, "
            "-1.000] (n=10) | too few to claim (n < 30), REGRESSION vs sft, ZERO |") in md
    # city_capital: 40/40 vs 10/40 on >= 30 questions, the interval above 0: a claimable win.
    assert "| type city_capital | 40 | 1.000 [1.000, 1.000] (40/40) | 0.250 |" in md
    assert "(n=40) | win vs sft |" in md


def test_fail_turns_the_go_into_a_no_go_naming_the_slice(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {}, _per_question())
    result, _ = build_gate(_config(slice_regression="fail"), ev, gold_pairs=500,
                           stages=_train(3600.0), training_curve={})
    assert not result.go and [c.name for c in result.failed] == ["slices"]
    (reason,) = result.reasons
    assert "type org_founder vs sft -1.000 [-1.000, -1.000] (n=10)" in reason
    assert "hops 2-hop vs sft" in reason and "rare" not in reason  # too few: never flagged
    # The same run with the collapse below slice_min_questions is a GO again.
    result, _ = build_gate(_config(slice_regression="fail", slice_min_questions=11), ev,
                           gold_pairs=500, stages=_train(3600.0), training_curve={})
    assert result.go, result.reasons


def test_fail_is_closed_without_per_question_results(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})  # no questions files on disk
    result, report = build_gate(_config(slice_regression="fail"), ev, gold_pairs=500,
                                stages=_train(3600.0), training_curve={})
    assert [c.name for c in result.failed] == ["slices"]
    assert "per-question results" in result.reasons[0]
    assert "Slices: not computed" in render_markdown(report)
    warn, _ = build_gate(_config(), ev, gold_pairs=500, stages=_train(3600.0),
                         training_curve={})
    assert warn.go, warn.reasons


def test_the_champion_is_compared_on_the_same_questions(tmp_path: Path) -> None:
    per = _per_question()
    per["champion"] = [dataclasses.replace(r, em=1.0) for r in per[TRAINED]
                       if r.qtype != "city_capital"]  # evaluated on a subset only
    report = compute_slices(per[TRAINED], {"sft": per["sft"], "champion": per["champion"]},
                            mode="warn", min_questions=5, samples=500, level=0.95, seed=0)
    slices = _by_label(report)
    capital = slices["type city_capital"].vs
    assert [d.against for d in capital] == ["sft", "champion"] and capital[1].delta.n == 0
    assert not capital[1].regression
    founder = slices["type org_founder"].regressions
    assert [d.against for d in founder] == ["sft", "champion"]


class _Recorded(NullSink):
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.metrics.update(metrics)


def test_the_stage_writes_slices_to_decision_json_and_logs_counts(tmp_path: Path) -> None:
    work = tmp_path / "work"
    config, dataset, ckpt, evaluation = _gate_stage_inputs(tmp_path, work,
                                                           per=_per_question())
    sink = _Recorded()
    decide_go_no_go(config, dataset, None, ckpt, evaluation, sink)
    assert sink.metrics["slice_regressions"] == 2.0 and sink.metrics["slices_at_zero"] == 4.0
    saved = json.loads((work / "decide_go_no_go" / "decision.json").read_text())
    slices = saved["slices"]
    assert slices["mode"] == "warn" and slices["against"] == ["sft"]
    assert slices["regressions"] == ["hops 2-hop vs sft", "type org_founder vs sft"]
    founder = next(s for s in slices["slices"] if s["name"] == "org_founder")
    assert founder["zero"] and founder["vs"][0]["delta"]["hi"] < 0
    assert saved["figures"]["slice_regressions"] == 2.0
