"""What the gate's accuracy condition compares with: the measured frontier system when
`eval.frontier` is configured; otherwise a stand-in, labelled as such in the decision box,
that may pass only when `gate.allow_stand_in_comparator` says so. And which checkpoint of the
run the report says was evaluated (best dev or last)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from searchrl.config import PipelineConfig
from searchrl.eval.baselines import FRONTIER, TRAINED
from searchrl.gate.payback import StageCost
from searchrl.gate.render import render_html, render_markdown
from searchrl.gate.report import build_gate, write_gate_report
from tests.unit.test_gate_report import _eval

STAGES = [StageCost("training", 3600.0, 1)]
GATE = {"gpu_price_per_hour": 2.0, "production_queries_per_month": 100_000,
        "min_gold_pairs": 100, "max_payback_months": 6.0, "min_accuracy_margin": 0.05}
FRONTIER_CFG = {"base_url": "http://127.0.0.1:9/v1", "model": "big",
                "price_per_1k_prompt_tokens": 0.01, "price_per_1k_completion_tokens": 0.03}


def _config(frontier: bool = False, **gate: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "gate": GATE | gate, "eval": {"frontier": FRONTIER_CFG if frontier else None}})


def _accuracy(result: object) -> str:
    return next(f"{'PASS' if c.passed else 'FAIL'} {c.detail}"
                for c in result.checks if c.name == "accuracy")  # type: ignore[attr-defined]


def test_a_stand_in_may_not_pass_by_default(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    result, report = build_gate(_config(), ev, gold_pairs=500, stages=STAGES,
                                training_curve={})
    assert not result.go and [c.name for c in result.failed] == ["accuracy"]
    detail = _accuracy(result)
    assert detail.startswith("FAIL") and "measured against a stand-in (sft)" in detail
    assert "gate.allow_stand_in_comparator=false" in detail
    md, page = render_markdown(report), render_html(report)
    assert ("**Comparator: best SFT-family system without RL: sft (the stronger by EM of sft "
            "0.300), a stand-in, NOT the frontier system") in md
    assert "may not pass" in md and 'id="comparator"' in page
    assert "frontier tokens / query (assumed" in md


def test_an_allowed_stand_in_passes_labelled(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    result, report = build_gate(_config(allow_stand_in_comparator=True), ev, gold_pairs=500,
                                stages=STAGES, training_curve={})
    assert result.go, result.reasons
    detail = _accuracy(result)
    assert "stand-in (sft), not the frontier system" in detail
    assert "stand-in allowed by gate.allow_stand_in_comparator" in detail
    assert "NOT the frontier system" in report.comparator and "may pass" in report.comparator


def test_the_measured_frontier_is_the_comparator_and_its_cost(tmp_path: Path) -> None:
    # The strongest baseline (sft 0.7) is not what a configured frontier is replaced by.
    ev = _eval(tmp_path, {"sft": 0.7, FRONTIER: 0.4, TRAINED: 0.6})
    result, report = build_gate(_config(frontier=True), ev, gold_pairs=500, stages=STAGES,
                                training_curve={})
    assert report.comparison_baseline == FRONTIER
    assert "vs frontier" in _accuracy(result) and "stand-in" not in _accuracy(result)
    # _eval's questions: 100 tokens, 20 of them completion -> 80 x 0.01 + 20 x 0.03 per 1k.
    assert report.costs.frontier_tokens_per_query == 100.0
    assert abs(report.costs.frontier_price_per_1k_tokens - (0.8 + 0.6) / 100) < 1e-12
    assert report.comparator.startswith("Comparator: the frontier system")
    # Not evaluated although configured: fails closed, never falls back to a stand-in.
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    result, report = build_gate(_config(frontier=True, allow_stand_in_comparator=True), ev,
                                gold_pairs=500, stages=STAGES, training_curve={})
    assert not result.go and "no frontier system" in _accuracy(result)


def test_the_report_shows_the_best_and_the_last_checkpoint(tmp_path: Path) -> None:
    ev = dataclasses.replace(_eval(tmp_path, {"sft": 0.3, TRAINED: 0.6}), policy_selection={
        "selection": "best", "metric": "dev_em", "selected_step": 60, "selected_value": 0.633,
        "last_step": 150, "last_value": 0.531})
    outcome = write_gate_report(_config(allow_stand_in_comparator=True), ev, tmp_path / "gate",
                                gold_pairs=500, stages=STAGES, metrics_path=None)
    md = outcome.md_path.read_text()
    assert ("Evaluated and registered on GO: the best dev checkpoint by dev_em, step 60 "
            "(dev_em 0.633); the last step was step 150 (dev_em 0.531)") in md
    assert 'id="policy-selection"' in outcome.html_path.read_text()
    saved = json.loads(outcome.decision_path.read_text())
    assert saved["policy_selection"]["selected_step"] == 60
    assert saved["comparator"]["kind"] == "stand-in" and saved["comparator"]["stand_in_allowed"]
    last = dataclasses.replace(ev, policy_selection={
        "selection": "last", "metric": "dev_em", "selected_step": 150,
        "selected_value": 0.531, "last_step": 150, "last_value": 0.531})
    _, report = build_gate(_config(), last, gold_pairs=500, stages=STAGES, training_curve={})
    assert report.policy_selection == ("Evaluated and registered on GO: the last step's policy, "
                                       "step 150 (dev_em 0.531) (train.keep_best is off).")


def test_the_report_says_when_the_start_was_handed_on(tmp_path: Path) -> None:
    ev = dataclasses.replace(_eval(tmp_path, {"sft": 0.45, TRAINED: 0.45}), policy_selection={
        "selection": "best", "metric": "dev_em", "selected_step": 0, "selected_value": 0.46,
        "last_step": 10, "last_value": 0.41, "stopped_early": True})
    _, report = build_gate(_config(), ev, gold_pairs=500, stages=STAGES, training_curve={})
    assert report.policy_selection.startswith(
        "Evaluated and registered on GO: the start policy, step 0 (dev_em 0.460), because no "
        "step's dev evaluation beat it; the last step was step 10 (dev_em 0.410)")


def test_the_report_says_when_training_stopped_early(tmp_path: Path) -> None:
    ev = dataclasses.replace(_eval(tmp_path, {"sft": 0.3, TRAINED: 0.6}), policy_selection={
        "selection": "best", "metric": "dev_em", "selected_step": 60, "selected_value": 0.633,
        "last_step": 100, "last_value": 0.51, "stopped_early": True})
    _, report = build_gate(_config(), ev, gold_pairs=500, stages=STAGES, training_curve={})
    assert report.policy_selection == (
        "Evaluated and registered on GO: the best dev checkpoint by dev_em, step 60 (dev_em "
        "0.633); the last step was step 100 (dev_em 0.510), where training stopped early "
        "(train.early_stop_patience dev evaluations in a row without a new best).")


def test_go_needs_non_inferiority_to_the_champion_on_the_same_questions(tmp_path: Path) -> None:
    """With eval.frontier the accuracy condition only compares with the frontier: a policy
    far above the frontier but below the champion is still a NO-GO (champion)."""
    ev = _eval(tmp_path, {FRONTIER: 0.2, "champion": 0.8, TRAINED: 0.6})
    result, report = build_gate(_config(frontier=True), ev, gold_pairs=500, stages=STAGES,
                                training_curve={}, champion_version="4")
    assert not result.go and [c.name for c in result.failed] == ["champion"]
    assert "version 4" in report.champion and "gate.champion_margin" in report.champion
    assert 'id="champion"' in render_html(report) and "**Champion: version 4" in \
        render_markdown(report)
    ev = _eval(tmp_path, {FRONTIER: 0.2, "champion": 0.6, TRAINED: 0.6})
    result, _ = build_gate(_config(frontier=True), ev, gold_pairs=500, stages=STAGES,
                           training_curve={}, champion_version="4")
    assert result.go, result.reasons


def test_no_champion_yet_is_stated_and_a_skipped_registered_one_fails(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {FRONTIER: 0.2, TRAINED: 0.6})
    result, report = build_gate(_config(frontier=True), ev, gold_pairs=500, stages=STAGES,
                                training_curve={})
    assert result.go and "none registered yet" in report.champion
    assert "train.init=base" in report.start
    result, report = build_gate(_config(frontier=True), ev, gold_pairs=500, stages=STAGES,
                                training_curve={}, champion_version="2")
    assert [c.name for c in result.failed] == ["champion"]
    assert "re-run evaluate_policy" in report.champion


def test_the_decision_box_says_what_training_started_from(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {FRONTIER: 0.2, TRAINED: 0.6})
    config = PipelineConfig.model_validate({
        "run": {"name": "world-b"}, "gate": GATE, "eval": {"frontier": FRONTIER_CFG},
        "train": {"init": "champion"}})
    _, report = build_gate(config, ev, gold_pairs=500, stages=STAGES, training_curve={})
    assert "continued from the registry's champion (searchrl-world-b@champion" in report.start
    assert "not the champion's own training" in report.start
    assert 'id="train-start"' in render_html(report)
