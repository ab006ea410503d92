"""A run reads only its own results: a stage whose input reference's files were replaced after
the reference was written (another run on the same work dir, a hand edit) refuses, naming the
file and the stage that wrote it, before it touches its own directory; a replacement while the
stage runs publishes nothing. (Two whole flows at once: tests/flows/test_concurrent_runs.py.)"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from searchrl import stages
from searchrl.config import PipelineConfig
from searchrl.eval.baselines import TRAINED
from searchrl.eval.results import RESULTS_FILE
from searchrl.exit_codes import exit_code_of
from searchrl.paths import StagePaths
from searchrl.sinks import NullSink
from searchrl.stages import (
    REF_FILE,
    ReplacedInputError,
    StageInputError,
    build_index,
    decide_go_no_go,
    evaluate_policy,
    files_of,
    filter_curriculum,
    train_policy,
)
from searchrl.types import CheckpointRef, CurriculumRef, DatasetRef, IndexRef
from tests.unit.test_gate_costs import _gate_stage_inputs
from tests.unit.test_gate_report import _eval


def _vouched(tmp_path: Path) -> dict[str, Any]:
    """This run's references, each vouching for its files as its stage wrote them."""
    split = tmp_path / "train.jsonl"
    split.write_text('{"id": "q1", "question": "Where?", "golden_answers": ["Oslo"]}\n')
    manifest = tmp_path / "index" / "manifest.json"
    manifest.parent.mkdir()
    manifest.write_text('{"fingerprint": "this run\'s index"}')
    curriculum = tmp_path / "curriculum.jsonl"
    curriculum.write_text(split.read_text())
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "model.safetensors").write_text("this run's weights")
    return {
        "dataset": DatasetRef(paths={"train": str(split)}, fingerprints={},
                              corpus_path=str(split), corpus_fingerprint="", fingerprint="d",
                              files=files_of(split)),
        "index": IndexRef(index_dir=str(manifest.parent), fingerprint="i", retriever="bm25",
                          files=files_of(manifest)),
        "curriculum": CurriculumRef(train_path=str(curriculum), fingerprint="c",
                                    files=files_of(curriculum)),
        "checkpoint": CheckpointRef(policy_dir=str(policy), fingerprint="p",
                                    files=files_of(policy)),
        "replaced": {"dataset": split, "index": manifest, "curriculum": curriculum,
                     "checkpoint": policy / "model.safetensors"}}


# stage, its dir, the input replaced, the stage that wrote that input, the call
CASES: list[tuple[str, Callable[[Path], Path], str, str,
                  Callable[[PipelineConfig, dict[str, Any]], object]]] = [
    ("build_index", lambda w: StagePaths(w).index_dir, "dataset", "validate_gold_labels",
     lambda c, r: build_index(c, r["dataset"], NullSink())),
    ("filter_curriculum", lambda w: StagePaths(w).curriculum_dir, "index", "build_index",
     lambda c, r: filter_curriculum(c, r["dataset"], r["index"], NullSink())),
    ("train_policy", lambda w: StagePaths(w).train_dir, "curriculum", "filter_curriculum",
     lambda c, r: train_policy(c, r["dataset"], r["index"], r["curriculum"], NullSink())),
    ("evaluate_policy", lambda w: StagePaths(w).eval_dir, "checkpoint", "train_policy",
     lambda c, r: evaluate_policy(c, r["dataset"], r["index"], r["checkpoint"], NullSink())),
]


@pytest.mark.parametrize(("stage", "stage_dir", "replaced", "producer", "run"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_stage_refuses_an_input_replaced_after_its_reference_was_written(
        tmp_path: Path, stage: str, stage_dir: Callable[[Path], Path], replaced: str,
        producer: str, run: Callable[[PipelineConfig, dict[str, Any]], object]) -> None:
    work = tmp_path / "work"
    config = PipelineConfig.model_validate({"run": {"work_dir": str(work), "device": "cpu"}})
    refs = _vouched(tmp_path)
    # Another run with other inputs has since written its own result there (same path).
    refs["replaced"][replaced].write_text("another run's")
    # That run's complete stage dir (this stage's), which a refusal must leave complete.
    own = stage_dir(work)
    own.mkdir(parents=True)
    (own / REF_FILE).write_text("the other run's reference")
    with pytest.raises(ReplacedInputError) as err:
        run(config, refs)
    message = str(err.value)
    vouched = next(iter(refs[replaced].files))  # the file, or the policy dir it is in
    assert message.startswith(f"{stage}: {vouched} changed after {producer} wrote it for this "
                              "run")
    assert "Re-run the pipeline" in message and "own run.work_dir" in message
    assert isinstance(err.value, StageInputError) and exit_code_of(err.value) == 3
    assert (own / REF_FILE).read_text() == "the other run's reference"


def test_the_gate_decides_on_its_own_evaluation_never_one_that_replaced_it(
        tmp_path: Path) -> None:
    work = tmp_path / "work"
    config, dataset, ckpt, evaluation = _gate_stage_inputs(tmp_path, work)
    results = Path(evaluation.results_path)
    evaluation = dataclasses.replace(evaluation, files=files_of(results))
    ours = results.read_bytes()
    # Another run's evaluate replaced the file with its own (valid) numbers.
    other = _eval(tmp_path / "other", {"sft": 0.6, TRAINED: 0.1}).to_dict()
    results.write_text(json.dumps(other))
    with pytest.raises(ReplacedInputError,
                       match=rf"decide_go_no_go: {results} changed after evaluate_policy wrote "
                             "it for this run"):
        decide_go_no_go(config, dataset, None, ckpt, evaluation, NullSink())
    assert not StagePaths(work).gate_dir.exists()  # nothing decided, nothing written
    # Its own numbers back (same content, another file): it decides on them.
    results.write_bytes(ours)
    decision = decide_go_no_go(config, dataset, None, ckpt, evaluation, NullSink())
    assert decision.figures["em_trained"] == pytest.approx(0.6)  # ours: the other run's 0.1
    assert (StagePaths(work).gate_dir / REF_FILE).is_file()


def test_a_replacement_while_the_gate_runs_is_caught_before_anything_is_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    config, dataset, ckpt, evaluation = _gate_stage_inputs(tmp_path, work)
    results = Path(evaluation.results_path)
    evaluation = dataclasses.replace(evaluation, files=files_of(results))
    real = stages.write_gate_report

    def racing(*args: Any, **kwargs: Any) -> Any:
        # Another run's evaluate finishes while this gate computes its report.
        other = _eval(tmp_path / "other", {"sft": 0.6, TRAINED: 0.1}).to_dict()
        (tmp_path / "other.json").write_text(json.dumps(other))
        (tmp_path / "other.json").replace(results)
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "write_gate_report", racing)
    with pytest.raises(ReplacedInputError, match=rf"{RESULTS_FILE} changed after evaluate_policy"):
        decide_go_no_go(config, dataset, None, ckpt, evaluation, NullSink())
    assert not (StagePaths(work).gate_dir / REF_FILE).exists()  # no decision published
