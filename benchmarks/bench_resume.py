"""How much a re-run of a failed pipeline saves over a from-scratch run (one run each).

1. from scratch: the whole pipeline in a fresh work dir / Prefect home / MLflow store;
2. failure: the same pipeline in another fresh workspace, SIGKILLed during training once a
   checkpoint past the middle of training exists (the process dies: no cleanup runs);
3. re-run: the same command again in that workspace. Stages 1-3 come from Prefect's
   persisted cache, training resumes from its newest complete checkpoint.

Prints both wall times, the ratio, and which stages the re-run executed. Usage:

    .venv/bin/python benchmarks/bench_resume.py [key=value overrides ...]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ["train.steps=12", "train.checkpoint_every=3", "eval.max_questions=40",
            "eval.bootstrap_samples=200", "curriculum.max_questions=48"]


def _env(workspace: Path) -> dict[str, str]:
    return {**os.environ, "PREFECT_HOME": str(workspace / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1",
            "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}


def _command(workspace: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, "flows/pipeline.py", "--config", "configs/tiny.yaml", *overrides,
            f"run.work_dir={workspace / 'work'}",
            f"tracking.tracking_uri=sqlite:///{workspace / 'mlflow.db'}"]


def _run(workspace: Path, overrides: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(_command(workspace, overrides), cwd=ROOT, env=_env(workspace),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"pipeline failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - start, proc.stdout + proc.stderr


def _checkpoint_steps(workspace: Path) -> list[int]:
    root = workspace / "work" / "train_policy" / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name.split("_")[1]) for p in root.glob("step_*") if p.is_dir())


def main() -> None:
    overrides = DEFAULTS + sys.argv[1:]
    steps = int(next(o for o in reversed(overrides) if o.startswith("train.steps="))
                .split("=")[1])
    scratch_ws = Path(tempfile.mkdtemp(prefix="resume-scratch-"))
    failed_ws = Path(tempfile.mkdtemp(prefix="resume-failed-"))

    scratch_s, _ = _run(scratch_ws, overrides)
    print(f"from scratch: {scratch_s:.1f} s")

    start = time.perf_counter()
    proc = subprocess.Popen(_command(failed_ws, overrides), cwd=ROOT, env=_env(failed_ws),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    while proc.poll() is None and not [s for s in _checkpoint_steps(failed_ws)
                                       if s > steps // 2]:
        time.sleep(0.5)
    if proc.poll() is not None:
        raise SystemExit("the pipeline ended before it could be killed mid-training")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = time.perf_counter() - start
    print(f"killed after {killed_at:.1f} s with checkpoints {_checkpoint_steps(failed_ws)}")

    rerun_s, log = _run(failed_ws, overrides)
    cached = sorted({line.split("'")[1].rsplit("-", 1)[0] for line in log.splitlines()
                     if "Cached(" in line and "Task run '" in line})
    print(f"re-run after failure: {rerun_s:.1f} s (cached stages: {cached})")
    print(json.dumps({"from_scratch_s": round(scratch_s, 1), "rerun_s": round(rerun_s, 1),
                      "rerun_over_scratch": round(rerun_s / scratch_s, 3),
                      "saved_s": round(scratch_s - rerun_s, 1), "cached_stages": cached}))


if __name__ == "__main__":
    main()
