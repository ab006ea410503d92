"""One process at a time where a step reads, changes and writes back: two stewards'
apply-audit runs are serialised (the second merges against the first's decisions: a conflict,
never a lost decision), and a second run of a stage in the same work dir is refused before it
clears or rewrites the directory the first one writes into."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from searchrl.config import PipelineConfig
from searchrl.exit_codes import exit_code_of
from searchrl.locks import BusyError
from searchrl.paths import StagePaths
from searchrl.sinks import NullSink
from searchrl.stages import (
    build_index,
    decide_go_no_go,
    evaluate_policy,
    filter_curriculum,
    validate_gold_labels,
)
from searchrl.validation import overrides as overrides_module
from searchrl.validation.overrides import load_overrides, merge_audit_decisions

# Holds `argv[1]`'s lock for argv[3] seconds (default: until killed), then with argv[2]
# merges those decisions, still holding it: a steward's apply-audit that is slow to finish.
_HOLDER = """
import sys, time
from pathlib import Path
from searchrl.locks import held
from searchrl.validation.overrides import merge_audit_decisions
target = Path(sys.argv[1])
with held(target, busy="a test holder"):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 600)
    if len(sys.argv) > 2:
        merge_audit_decisions(Path(sys.argv[2]), target, steward="ana")
"""


def _holder(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, *args], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _decisions(path: Path, decision: str, answers: list[str]) -> Path:
    row = {"key": "train/t9", "split": "train", "example_id": "t9", "tier": "gold_likely_wrong",
           "golden_answers": ["Quellandia"], "answer": "Quelland", "decision": decision,
           "corrected_answers": answers, "reason": "checked", "steward": ""}
    path.write_text(json.dumps(row) + "\n")
    return path


def test_two_stewards_applying_audits_at_once_are_serialised_and_nothing_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("[]\n")
    ana = _decisions(tmp_path / "ana.jsonl", "correct", ["Quelland"])
    bo = _decisions(tmp_path / "bo.jsonl", "accept", [])
    first = _holder(str(overrides), str(ana), "1.0")  # Ana's apply-audit, under way
    try:
        # Bo's starts meanwhile: it waits for Ana's to finish, then merges against it.
        second = merge_audit_decisions(bo, overrides, steward="bo")
    finally:
        first.wait(timeout=60)
    assert second.added == [] and len(second.conflicts) == 1 and "by ana" in second.conflicts[0]
    assert [(o.action, o.steward) for o in load_overrides(overrides)] == [("correct", "ana")]
    # A holder that does not finish in time: refused, naming it (exit 12), the file untouched.
    before = overrides.read_text()
    monkeypatch.setattr(overrides_module, "MERGE_WAIT_S", 0.3)
    stuck = _holder(str(overrides))
    try:
        with pytest.raises(BusyError, match=rf"pid {stuck.pid} on .*waited 0.3 s") as err:
            merge_audit_decisions(bo, overrides, steward="bo")
        assert exit_code_of(err.value) == 12
    finally:
        stuck.kill()
        stuck.wait()
    assert overrides.read_text() == before


def test_a_second_run_of_a_stage_in_the_same_work_dir_is_refused_before_touching_it(
        tmp_path: Path) -> None:
    config = PipelineConfig.model_validate({"run": {"work_dir": str(tmp_path / "work")}})
    paths = StagePaths(config.run.work_dir)
    unused: Any = None  # refused before any input is read
    stages: list[tuple[Path, Callable[[], object]]] = [
        (paths.validate_dir, lambda: validate_gold_labels(config, NullSink())),
        (paths.index_dir, lambda: build_index(config, unused, NullSink())),
        (paths.curriculum_dir, lambda: filter_curriculum(config, unused, unused, NullSink())),
        (paths.eval_dir, lambda: evaluate_policy(config, unused, unused, unused, NullSink())),
        (paths.gate_dir,
         lambda: decide_go_no_go(config, unused, unused, unused, unused, NullSink()))]
    for stage_dir, run in stages:
        stage_dir.mkdir(parents=True)
        (stage_dir / "results.json").write_text("the first run's")
        holder = _holder(str(stage_dir))
        try:
            with pytest.raises(BusyError, match=rf"{stage_dir.name}.*pid {holder.pid} on"):
                run()
        finally:
            holder.kill()
            holder.wait()
        assert (stage_dir / "results.json").read_text() == "the first run's"
