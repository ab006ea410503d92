"""Compute charged by the gate: wall time x devices per stage (curriculum, training,
evaluation), the projection of a prototype's training to the configured full run, the
per-stage table in the report, and failing closed on what was not recorded."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from searchrl.config import PipelineConfig
from searchrl.datasets.io import write_jsonl
from searchrl.eval.baselines import TRAINED
from searchrl.eval.metrics import QuestionResult
from searchrl.eval.results import RESULTS_FILE
from searchrl.gate.payback import (
    Projection,
    StageCost,
    project_training,
    total_device_hours,
)
from searchrl.gate.render import render_html, render_markdown
from searchrl.gate.report import build_gate, stage_costs, training_volume
from searchrl.paths import StagePaths
from searchrl.sinks import NullSink
from searchrl.stages import (
    GateInputError,
    ReplacedInputError,
    decide_go_no_go,
    files_of,
    write_ref,
)
from searchrl.types import CheckpointRef, CurriculumRef, DatasetRef, EvalRef
from tests.unit.test_gate_report import _eval

# 0.5 h curriculum on 1 device + 2 devices x 1800 s training + 900 s evaluation on 1 device.
STAGES = [StageCost("curriculum", 1800.0, 1), StageCost("training", 1800.0, 2),
          StageCost("evaluation", 900.0, 1)]


def test_device_hours_are_wall_time_times_devices() -> None:
    assert StageCost("training", 1800.0, 2).device_hours == pytest.approx(1.0)
    assert StageCost("training", 36.0, 1).device_hours == pytest.approx(0.01)
    for bad in (StageCost("t", None, 1), StageCost("t", math.nan, 1), StageCost("t", -1.0, 1),
                StageCost("t", 10.0, 0)):
        assert math.isnan(bad.device_hours)
    assert total_device_hours(STAGES) == pytest.approx(0.5 + 1.0 + 0.25)


def test_projection_by_steps_and_by_tokens() -> None:
    by_steps = project_training(1.0, steps_done=100, tokens_done=5e6, full_run_steps=1000,
                                full_run_tokens=None)
    assert by_steps == Projection("steps", 100, 1000.0, 1.0)
    assert by_steps.ratio == pytest.approx(10.0)
    assert by_steps.projected_device_hours == pytest.approx(10.0)
    # Tokens win when configured: 2e8 / 5e6 = x40.
    by_tokens = project_training(1.0, steps_done=100, tokens_done=5e6, full_run_steps=1000,
                                 full_run_tokens=2e8)
    assert by_tokens is not None and by_tokens.basis == "tokens"
    assert by_tokens.ratio == pytest.approx(40.0)
    assert project_training(1.0, steps_done=100, tokens_done=None, full_run_steps=None,
                            full_run_tokens=None) is None
    # Curriculum 0.5 + training 1.0 x 10 + evaluation 0.25.
    assert total_device_hours(STAGES, by_steps) == pytest.approx(10.75)
    unknown = project_training(1.0, steps_done=None, tokens_done=None, full_run_steps=1000,
                               full_run_tokens=None)
    assert unknown is not None and math.isnan(total_device_hours(STAGES, unknown))


def _metrics(path: Path, steps: int = 100) -> Path:
    rows = [{"step": i + 1, "rollout_tokens": 300.0, "update_tokens": 700.0, "loss": 0.1}
            for i in range(steps)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    return path


def test_training_volume_from_trainer_metrics(tmp_path: Path) -> None:
    vol = training_volume(_metrics(tmp_path / "metrics.jsonl"))
    assert vol.steps == 100 and vol.tokens_per_rank == pytest.approx(100 * 1000.0)
    assert training_volume(tmp_path / "missing.jsonl").steps is None


def _config(**gate: object) -> PipelineConfig:
    base = {"gpu_price_per_hour": 2.0, "production_queries_per_month": 100_000,
            "min_gold_pairs": 100, "max_payback_months": 6.0, "min_accuracy_margin": 0.05,
            "allow_stand_in_comparator": True}  # no frontier endpoint in these tests
    return PipelineConfig.model_validate({"run": {"device": "cpu"}, "gate": base | gate})


def test_gate_charges_projected_full_run_and_reports_it(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    vol = training_volume(_metrics(tmp_path / "metrics.jsonl"))
    result, report = build_gate(_config(full_run_steps=1000), ev, gold_pairs=500,
                                stages=STAGES, training_curve={}, volume=vol)
    assert report.costs.training_gpu_hours == pytest.approx(10.75)
    assert result.payback is not None
    assert result.payback.training_cost == pytest.approx(10.75 * 2.0)
    assert report.device_unit == "device-hours (cpu)"
    md = render_markdown(report)
    assert "Payback charges the projected full run: training x10.00 by steps" in md
    assert "| stage | wall time | devices | device-hours (cpu) | cost |" in md
    assert "| curriculum | 30.0 min | 1 | 0.5000 | 1.00 |" in md
    assert "| training | 30.0 min | 2 | 1.0000 | 2.00 |" in md
    assert "| evaluation | 15.0 min | 1 | 0.2500 | 0.50 |" in md
    assert "| training, projected to the full run (x10.00 by steps) |  |  | 10.0000 | 20.00 |" \
        in md
    assert "| charged by the payback condition |  |  | 10.7500 | 21.50 |" in md
    assert "| projection ratio (full / prototype) | 10.00 |" in md
    page = render_html(report, figures={})
    assert 'id="cost-basis">Payback charges the projected full run' in page
    # Tokens: 2 ranks x 100 steps x 1000 tokens = 2e5 done; 4e6 configured -> x20.
    _, by_tokens = build_gate(_config(full_run_steps=1000, full_run_tokens=4e6), ev,
                              gold_pairs=500, stages=STAGES, training_curve={}, volume=vol)
    assert by_tokens.projection is not None and by_tokens.projection.ratio == pytest.approx(20)
    assert by_tokens.costs.training_gpu_hours == pytest.approx(0.5 + 20.0 + 0.25)


def test_without_full_run_size_no_projection_row_and_a_note(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    result, report = build_gate(_config(), ev, gold_pairs=500, stages=STAGES,
                                training_curve={}, volume=training_volume(None))
    assert result.go and report.projection is None
    assert report.costs.training_gpu_hours == pytest.approx(1.75)
    md = render_markdown(report)
    assert "projected" not in md.split("## Compute by stage")[1].split("##")[0]
    assert "projection ratio" not in md
    assert "no full-run size is configured" in md and "nothing is projected" in md


def test_projection_without_steps_done_fails_closed(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    result, report = build_gate(_config(full_run_steps=1000), ev, gold_pairs=500,
                                stages=STAGES, training_curve={}, volume=training_volume(None))
    assert not result.go and [c.name for c in result.failed] == ["payback"]
    assert "training_gpu_hours is missing" in result.reasons[0]
    assert "| projection ratio (full / prototype) | n/a |" in render_markdown(report)


def test_configured_hours_replace_measurement(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6})
    _, report = build_gate(_config(training_gpu_hours=5.0, full_run_steps=1000), ev,
                           gold_pairs=500, stages=STAGES, training_curve={},
                           volume=training_volume(_metrics(tmp_path / "m.jsonl")))
    assert report.costs.training_gpu_hours == 5.0
    assert "configured gate.training_gpu_hours = 5" in report.cost_basis


def test_stage_costs_from_references() -> None:
    ckpt = CheckpointRef(policy_dir="p", fingerprint="f", training_seconds=500.0,
                         seconds=1800.0, devices=2)
    cur = CurriculumRef(train_path="t", fingerprint="c", seconds=600.0, devices=1)
    ev = EvalRef(results_path="r", fingerprint="e", seconds=60.0)
    costs, notes = stage_costs(cur, ckpt, ev)
    assert [(c.stage, c.seconds, c.devices) for c in costs] == [
        ("curriculum", 600.0, 1), ("training", 1800.0, 2), ("evaluation", 60.0, 1)]
    assert notes == []
    # Older references: training falls back to the trainer's seconds; the rest count 0.
    costs, notes = stage_costs(None, CheckpointRef(policy_dir="p", fingerprint="f",
                                                   training_seconds=500.0), None)
    assert [c.seconds for c in costs] == [0.0, 500.0, 0.0]
    assert len(notes) == 3 and "counted as 0" in notes[0]
    costs, notes = stage_costs(cur, CheckpointRef(policy_dir="p", fingerprint="f"), ev)
    assert costs[1].seconds is None and "not recorded" in notes[0]
    # A resumed run: the note says how much of its time earlier attempts took.
    resumed = CheckpointRef(policy_dir="p", fingerprint="f", training_seconds=500.0,
                            seconds=1800.0, earlier_attempts_seconds=1200.0, devices=2)
    costs, notes = stage_costs(cur, resumed, ev)
    assert costs[1].seconds == 1800.0
    assert notes == [notes[0]] and "resumed" in notes[0] and "1200 s" in notes[0]


def _gate_stage_inputs(tmp_path: Path, work: Path, *, trained_errors: int = 0,
                       per: dict[str, list[QuestionResult]] | None = None) -> tuple[
        PipelineConfig, DatasetRef, CheckpointRef, EvalRef]:
    """The gate stage's config and input references over a small evaluation on disk
    (`per`: its per-question results, see test_gate_report._eval)."""
    config = PipelineConfig.model_validate({"run": {"work_dir": str(work), "device": "cpu"},
                                            "gate": {"min_gold_pairs": 10}})
    data = _eval(tmp_path, {"sft": 0.3, TRAINED: 0.6}, per).to_dict()
    data["systems"][TRAINED]["summary"]["search_errors"] = trained_errors
    results = tmp_path / RESULTS_FILE
    results.write_text(json.dumps(data))
    train = tmp_path / "train.jsonl"
    write_jsonl(train, [{"q": i} for i in range(50)])
    dataset = DatasetRef(paths={"train": str(train)}, fingerprints={}, corpus_path="",
                         corpus_fingerprint="", fingerprint="x")
    ckpt = CheckpointRef(policy_dir=str(tmp_path), fingerprint="p", seconds=1800.0, devices=2)
    evaluation = EvalRef(results_path=str(results), fingerprint="e", seconds=900.0)
    return config, dataset, ckpt, evaluation


def test_gate_stage_charges_the_curriculum_its_reference_recorded(tmp_path: Path) -> None:
    work = tmp_path / "work"
    config, dataset, ckpt, evaluation = _gate_stage_inputs(tmp_path, work)
    train = Path(dataset.paths["train"])
    stale = work / "decide_go_no_go" / "report_old.html"  # an earlier run's: not published
    stale.parent.mkdir(parents=True)
    stale.write_text("old")
    # A curriculum ref on disk that is not this run's input is not read: no curriculum given.
    cur_dir = StagePaths(work).curriculum_dir
    cur_dir.mkdir(parents=True)
    other = CurriculumRef(train_path=str(train), fingerprint="o", files=files_of(train),
                          seconds=99_000.0, devices=8)
    write_ref(other, cur_dir)
    no_cur = decide_go_no_go(config, dataset, None, ckpt, evaluation, NullSink())
    assert not stale.exists()
    assert no_cur.figures["curriculum_device_hours"] == 0.0
    assert "curriculum stage" in Path(no_cur.report_md or "").read_text()
    curriculum = CurriculumRef(train_path=str(train), fingerprint="c", files=files_of(train),
                               seconds=1800.0, devices=1)
    decision = decide_go_no_go(config, dataset, curriculum, ckpt, evaluation, NullSink())
    assert decision.figures["curriculum_device_hours"] == pytest.approx(0.5)
    assert decision.figures["training_device_hours"] == pytest.approx(1.0)
    assert decision.figures["evaluation_device_hours"] == pytest.approx(0.25)
    assert decision.figures["device_hours_charged"] == pytest.approx(1.75)
    assert math.isnan(decision.figures["projection_ratio"])
    saved = json.loads((work / "decide_go_no_go" / "decision.json").read_text())
    assert [s["stage"] for s in saved["stages"]] == ["curriculum", "training", "evaluation"]
    # Another run replaced the curriculum's files after it was written for this run: the gate
    # does not charge (or decide on) another run's curriculum.
    write_jsonl(train, [{"q": i} for i in range(60)])
    with pytest.raises(ReplacedInputError, match="changed after filter_curriculum"):
        decide_go_no_go(config, dataset, curriculum, ckpt, evaluation, NullSink())


def test_the_gate_does_not_decide_on_failed_searches(tmp_path: Path) -> None:
    work = tmp_path / "work"
    config, dataset, ckpt, evaluation = _gate_stage_inputs(tmp_path, work, trained_errors=3)
    with pytest.raises(GateInputError, match=rf"failed searches.*{TRAINED}: 3"):
        decide_go_no_go(config, dataset, None, ckpt, evaluation, NullSink())
    assert not (work / "decide_go_no_go" / "decision.json").exists()  # no decision written
