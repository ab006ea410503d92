"""`prefect deploy` from the repo root against a real local server, run by a process worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_deploy_and_run_through_a_process_worker(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        ["bash", "scripts/deploy_smoke.sh", f"run.work_dir={tmp_path / 'work'}",
         f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
         "data.synthetic.n_train=60", "train.steps=2"],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "BIN": str(bin_dir),
             "PREFECT_HOME": str(tmp_path / "prefect"), "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "state: COMPLETED" in proc.stdout
