"""Assembling the gate from evaluation results: baseline choice, measured vs configured inputs,
fail-closed on unmeasured training time, report files, and the stage task without tracking."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from searchrl.config import PipelineConfig
from searchrl.datasets.io import write_jsonl
from searchrl.eval.baselines import TRAINED, SystemSpec
from searchrl.eval.metrics import (
    QuestionResult,
    breakdown,
    by_hops,
    by_searched,
    by_type,
    paired_bootstrap_delta,
    summarize,
)
from searchrl.eval.results import RESULTS_FILE, EvalResult, SystemResult
from searchrl.gate.payback import StageCost
from searchrl.gate.report import (
    build_gate,
    choose_baseline,
    count_rows,
    load_training_curve,
)
from searchrl.types import CheckpointRef, DatasetRef, EvalRef


def _qs(acc: float, n: int = 60, tokens: int = 100) -> list[QuestionResult]:
    return [QuestionResult(example_id=f"q{i}", hops=1 + i % 3, qtype="t", em=float(i < acc * n),
                           f1=float(i < acc * n), searches=1, format_ok=True,
                           prompt_tokens=tokens - 20, response_tokens=20, latency_s=0.01,
                           answered=True, finish_reason="answer") for i in range(n)]


def _eval(tmp: Path, accs: dict[str, float],
          per: dict[str, list[QuestionResult]] | None = None) -> EvalResult:
    """`per`: each system's own per-question results (written to questions files, as the
    evaluation does) instead of `_qs(acc)` with none on disk."""
    written = per is not None
    per = per if per is not None else {name: _qs(a) for name, a in accs.items()}
    for name, rs in per.items():
        if written:
            write_jsonl(tmp / f"questions_{name}.jsonl", [r.to_dict() for r in rs])
    systems = {name: SystemResult(
        spec=SystemSpec(name, "p", "agentic", name), summary=summarize(rs, samples=200),
        by_hops=breakdown(rs, by_hops, samples=50), by_type=breakdown(rs, by_type, samples=50),
        by_searched=breakdown(rs, by_searched, samples=50),
        questions_path=str(tmp / f"questions_{name}.jsonl") if written else "",
        trajectories_path="", seconds=1.0) for name, rs in per.items()}
    deltas = {n: paired_bootstrap_delta([r.em for r in per[TRAINED]], [r.em for r in rs],
                                        samples=500)
              for n, rs in per.items() if n != TRAINED and TRAINED in per}
    spath = tmp / "suspects.jsonl"
    write_jsonl(spath, [{"example_id": "q1", "question": "?", "golden_answers": ["a"],
                         "answer": "b", "confidence": 0.9}])
    return EvalResult(eval_set="test", n_questions=60, systems=systems, deltas=deltas,
                      suspects_path=str(spath), n_suspects=1, notes=("champion skipped",))


def _config(**gate: object) -> PipelineConfig:
    base = {"gpu_price_per_hour": 2.0, "production_queries_per_month": 100_000,
            "min_gold_pairs": 100, "max_payback_months": 6.0, "min_accuracy_margin": 0.05,
            "allow_stand_in_comparator": True}  # no frontier endpoint in these tests
    return PipelineConfig.model_validate({"gate": base | gate})


def _train(seconds: float | None) -> list[StageCost]:
    return [StageCost("curriculum", 0.0, 1), StageCost("training", seconds, 1),
            StageCost("evaluation", 0.0, 1)]


def test_best_is_the_stronger_learned_system_without_rl(tmp_path: Path) -> None:
    # retrieve_once and scripted are stronger, yet neither learns: "without RL" means the
    # fine-tuned systems (sft, rejection_sampling), whichever of them is stronger.
    ev = _eval(tmp_path, {"no_search": 0.1, "retrieve_once": 0.5, "scripted": 0.9,
                          "sft": 0.3, "rejection_sampling": 0.4, TRAINED: 0.6})
    name, notes = choose_baseline(ev, "best")
    assert name == "rejection_sampling"
    assert "the stronger by EM of sft 0.300, rejection_sampling 0.400" in notes[0]
    ev = _eval(tmp_path, {"retrieve_once": 0.5, "sft": 0.45, "rejection_sampling": 0.4,
                          TRAINED: 0.6})
    assert choose_baseline(ev, "best")[0] == "sft"
    assert choose_baseline(ev, "retrieve_once") == ("retrieve_once", [])  # named: as named
    name, notes = choose_baseline(ev, "champion")
    assert name == "champion" and "not evaluated" in notes[0]


def test_best_without_an_sft_family_system_fails_closed_never_falls_back(
        tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"no_search": 0.1, "retrieve_once": 0.2, "scripted": 0.3,
                          TRAINED: 0.6})
    name, notes = choose_baseline(ev, "best")
    assert name == "best" and "no learned system without RL (sft, rejection_sampling)" in notes[0]
    result, report = build_gate(_config(), ev, gold_pairs=500, stages=_train(3600.0),
                                training_curve={})
    assert not result.go and [c.name for c in result.failed] == ["accuracy"]
    assert "comparator best not fully measured" in result.reasons[0]
    assert report.comparison_baseline == "best" and "NOT evaluated" in report.comparator


def test_best_never_picks_the_champion(tmp_path: Path) -> None:
    # The champion has its own check (non-inferiority); as the accuracy bar it made every
    # week after the first GO beat it by min_accuracy_margin (seen in the two-week run).
    ev = _eval(tmp_path, {"sft": 0.3, "champion": 0.55, TRAINED: 0.6})
    assert choose_baseline(ev, "best")[0] == "sft"
    assert choose_baseline(ev, "champion") == ("champion", [])  # named: still possible


def test_go_with_measured_inputs_and_no_go_when_baseline_close(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    result, report = build_gate(_config(), ev, gold_pairs=500, stages=_train(3600.0),
                                training_curve={})
    assert result.go, result.reasons
    assert report.costs.training_gpu_hours == 1.0
    assert report.costs.small_tokens_per_query == 100.0  # measured: prompt + response
    assert report.comparison_baseline == "sft"
    close = _eval(tmp_path, {"sft": 0.58, TRAINED: 0.6})
    result, _ = build_gate(_config(), close, gold_pairs=500, stages=_train(3600.0),
                           training_curve={})
    assert not result.go and [c.name for c in result.failed] == ["accuracy"]


def test_unrecorded_training_time_fails_closed_unless_configured(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    result, report = build_gate(_config(), ev, gold_pairs=500, stages=_train(None),
                                training_curve={})
    assert not result.go and [c.name for c in result.failed] == ["payback"]
    assert "training_gpu_hours" in result.reasons[0]
    result, report = build_gate(_config(training_gpu_hours=5.0), ev, gold_pairs=500,
                                stages=_train(None), training_curve={})
    assert result.go and report.costs.training_gpu_hours == 5.0


def test_missing_trained_system_fails_closed(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3})
    result, _ = build_gate(_config(), ev, gold_pairs=500, stages=_train(3600.0),
                           training_curve={})
    assert not result.go
    assert {c.name for c in result.failed} == {"accuracy", "payback"}


def test_training_curve_and_row_count(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "rollout/reward_mean": 0.1, "loss": 3}\n'
                       "not json\n"
                       '{"step": 2, "rollout/reward_mean": 0.3, "em": NaN}\n')
    curve = load_training_curve(metrics, ("reward_mean", "em"))
    assert curve == {"rollout/reward_mean": [(1, 0.1), (2, 0.3)]}
    assert load_training_curve(tmp_path / "missing.jsonl", ("em",)) == {}
    data = tmp_path / "train.jsonl"
    write_jsonl(data, [{"a": 1}, {"a": 2}, {"a": 3}])
    assert count_rows(data) == 3
    assert count_rows(tmp_path / "nope.jsonl") is None


def test_stage_task_writes_report_without_tracking(tmp_path: Path) -> None:
    from tasks.gate import decide_go_no_go

    ev = _eval(tmp_path, {"sft": 0.2, "retrieve_once": 0.3, TRAINED: 0.6})
    results = tmp_path / RESULTS_FILE
    results.write_text(json.dumps(ev.to_dict()))
    train = tmp_path / "train.jsonl"
    write_jsonl(train, [{"q": i} for i in range(150)])
    config = PipelineConfig.model_validate({"run": {"work_dir": str(tmp_path / "work")},
                                            "gate": {"min_gold_pairs": 200}})
    dataset = DatasetRef(paths={"train": str(train)}, fingerprints={}, corpus_path="",
                         corpus_fingerprint="", fingerprint="x")
    ckpt = CheckpointRef(policy_dir=str(tmp_path), fingerprint="p", training_seconds=36.0)
    decision = decide_go_no_go.fn(config, dataset, None, ckpt,
                                  EvalRef(results_path=str(results), fingerprint="e"),
                                  None, None)
    assert not decision.go and decision.label == "NO-GO"
    assert any(r.startswith("data: 150 gold pairs < required 200") for r in decision.reasons)
    assert decision.report_html and Path(decision.report_html).is_file()
    md = Path(decision.report_md or "").read_text()
    assert "Decision: **NO-GO**" in md and "FAIL data" in md
    assert decision.figures["gold_pairs"] == 150.0
    assert math.isclose(decision.figures["em_trained"], 0.6)
    saved = json.loads((tmp_path / "work" / "decide_go_no_go" / "decision.json").read_text())
    assert saved["label"] == "NO-GO" and saved["comparison_baseline"] == "sft"


# --- skipped steps: stated in the report; a run whose steps were all skipped is a NO-GO


def _metrics(path: Path, rows: list[dict[str, float]]) -> Path:
    path.write_text("".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows)))
    return path


NO_VARIANCE = {"skipped": 1.0, "groups_used": 0.0, "reward_mean": 0.0}
NON_FINITE = {"skipped": 1.0, "groups_used": 2.0, "reward_mean": 0.5}
UPDATED = {"loss": 0.1, "groups_used": 2.0, "reward_mean": 0.5}


def test_training_steps_counts_skips_by_cause_and_updates_up_to_the_selected_step(
        tmp_path: Path) -> None:
    from searchrl.gate.report import training_steps

    path = _metrics(tmp_path / "metrics.jsonl", [NO_VARIANCE, NON_FINITE, UPDATED, NO_VARIANCE])
    steps = training_steps(path, selected_step=None)
    assert steps is not None
    assert (steps.steps, steps.skipped_no_variance, steps.skipped_nonfinite) == (4, 2, 1)
    assert steps.updates_to_selected == 1 and not steps.changed_nothing
    assert training_steps(path, selected_step=2).changed_nothing  # type: ignore[union-attr]
    assert training_steps(None, selected_step=None) is None  # not given: no condition
    missing = training_steps(tmp_path / "missing.jsonl", selected_step=None)
    assert missing is not None and missing.steps == 0  # given but empty: fails closed
    assert not missing.check().passed and "no training step is recorded" in missing.check().detail


def test_a_run_whose_steps_were_all_skipped_is_no_go_training_changed_nothing(
        tmp_path: Path) -> None:
    from searchrl.gate.report import write_gate_report

    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})  # GO on every other condition
    metrics = _metrics(tmp_path / "metrics.jsonl", [NO_VARIANCE, NO_VARIANCE, NON_FINITE])
    outcome = write_gate_report(_config(), ev, tmp_path / "gate", gold_pairs=500,
                                stages=_train(3600.0), metrics_path=metrics)
    assert not outcome.result.go
    assert [c.name for c in outcome.result.failed] == ["training"]
    assert outcome.result.reasons[0].startswith("training: training changed nothing: all 3 "
                                                "steps were skipped")
    md = outcome.md_path.read_text()
    head = md.split("## ")[0]  # the decision box, before the sections
    assert "Decision: **NO-GO**" in head and "Training changed nothing" in head
    assert "2 without reward variance, 1 with non-finite values" in head
    assert 'id="training"' in outcome.html_path.read_text()
    saved = json.loads(outcome.decision_path.read_text())
    assert saved["figures"]["skipped_steps"] == 3.0 and saved["figures"]["training_steps"] == 3.0


def test_a_run_where_fewer_than_half_of_the_steps_updated_is_no_go(tmp_path: Path) -> None:
    """The demo of issue 43: 1 of 10 steps updated the policy and the condition said PASS."""
    from searchrl.gate.report import write_gate_report

    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})  # GO on every other condition
    metrics = _metrics(tmp_path / "metrics.jsonl", [UPDATED] + [NO_VARIANCE] * 9)
    outcome = write_gate_report(_config(), ev, tmp_path / "gate", gold_pairs=500,
                                stages=_train(3600.0), metrics_path=metrics)
    assert not outcome.result.go
    assert [c.name for c in outcome.result.failed] == ["training"]
    assert outcome.result.reasons[0].startswith(
        "training: too few steps updated the policy: 1 of 10 steps updated the policy")
    half = _metrics(tmp_path / "half.jsonl", [UPDATED, NO_VARIANCE] * 2)
    outcome = write_gate_report(_config(), ev, tmp_path / "gate2", gold_pairs=500,
                                stages=_train(3600.0), metrics_path=half)
    assert outcome.result.go, outcome.result.reasons  # half is enough


def test_skipped_steps_are_stated_and_a_run_that_learned_passes(tmp_path: Path) -> None:
    from searchrl.gate.report import write_gate_report

    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    metrics = _metrics(tmp_path / "metrics.jsonl", [NO_VARIANCE, UPDATED, UPDATED])
    outcome = write_gate_report(_config(), ev, tmp_path / "gate", gold_pairs=500,
                                stages=_train(3600.0), metrics_path=metrics)
    assert outcome.result.go, outcome.result.reasons
    training = next(c for c in outcome.result.checks if c.name == "training")
    assert training.passed and "2 of 3 steps updated the policy" in training.detail
    assert "1 skipped (1 without reward variance, 0 with non-finite values)" in training.detail
    # The evaluated policy is the best dev checkpoint of step 1: nothing before it updated.
    best = dataclasses.replace(ev, policy_selection={
        "selection": "best", "metric": "dev_em", "selected_step": 1, "selected_value": 0.4,
        "last_step": 3, "last_value": 0.3})
    outcome = write_gate_report(_config(), best, tmp_path / "gate2", gold_pairs=500,
                                stages=_train(3600.0), metrics_path=metrics)
    assert not outcome.result.go
    assert "the evaluated policy (step 1) is the cold-start policy" in outcome.result.reasons[0]
