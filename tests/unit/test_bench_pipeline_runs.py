"""benchmarks/pipeline_runs.py: a benchmark reads a finished pipeline run only while it was
made from this config and this code; otherwise it runs the pipeline again (which re-runs what
the change reaches). Once stale, the stamp is gone before the run starts: a run stopped
half-way is never read as current."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def runs() -> Any:
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import pipeline_runs
        return pipeline_runs
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))


def test_a_finished_run_stands_only_while_its_config_and_code_do(
        runs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []

    def pipeline(args: list[str], log: Path) -> int:
        started.append(args)  # the pipeline itself takes minutes; what it leaves is a decision
        (run_dir / "decide_go_no_go").mkdir(parents=True, exist_ok=True)
        (run_dir / "decide_go_no_go" / "decision.json").write_text("{}")
        return 1  # a NO-GO: a finished run

    monkeypatch.setattr(runs, "run_pipeline", pipeline)
    run_dir, log = tmp_path / "seed0", tmp_path / "seed0.log"
    overrides = ["data.synthetic.seed=101", f"run.work_dir={run_dir}"]
    assert runs.ensure_run("configs/tiny.yaml", overrides, run_dir, log) is not None
    assert runs.ensure_run("configs/tiny.yaml", overrides, run_dir, log) is None  # stands
    assert len(started) == 1
    # Another config: run again.
    other = [*overrides, "train.steps=3"]
    assert runs.made_from("configs/tiny.yaml", other) != runs.made_from("configs/tiny.yaml",
                                                                        overrides)
    assert runs.ensure_run("configs/tiny.yaml", other, run_dir, log) is not None
    assert len(started) == 2
    # Other code (a stage's fingerprint): run again.
    monkeypatch.setattr(runs, "code_fingerprint", lambda fn: "edited")
    assert runs.ensure_run("configs/tiny.yaml", other, run_dir, log) is not None
    assert len(started) == 3
    # A run that fails takes its stamp with it: the next call runs again.
    monkeypatch.setattr(runs, "run_pipeline", lambda args, log: 3)
    monkeypatch.setattr(runs, "code_fingerprint", lambda fn: "edited again")
    with pytest.raises(SystemExit, match="pipeline exited 3"):
        runs.ensure_run("configs/tiny.yaml", other, run_dir, log)
    assert not run_dir.with_name("seed0.made_from").exists()
