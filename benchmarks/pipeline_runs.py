"""Whole-pipeline runs for the benchmarks that compare them (bench_sealed, bench_selection,
bench_candidates, bench_reward_schemes): `flows/pipeline.py` in a subprocess, offline, its log
beside it, and a stamp of what a finished run was made from (the effective config and every
stage's code), so that a benchmark reads a finished run only while it is still this config's
and this code's. Otherwise the pipeline runs again and re-runs the stages the change reaches
(Prefect's cache keeps the others).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from searchrl.codehash import code_fingerprint
from searchrl.config import load_config
from searchrl.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
COSTED_STAGES = ("filter_curriculum", "train_policy", "evaluate_policy")


def made_from(config: str, overrides: Sequence[str]) -> str:
    """sha256 of the effective config and of every stage's code (`code_fingerprint`)."""
    effective = load_config(config, list(overrides)).to_dict()
    code = {name: code_fingerprint(stage.run) for name, stage in STAGES.items()}
    text = json.dumps({"config": effective, "code": code}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def ensure_run(config: str, overrides: Sequence[str], run_dir: Path, log: Path) -> float | None:
    """`flows/pipeline.py --config CONFIG OVERRIDES` (whose `run.work_dir` is `run_dir`),
    unless `run_dir` holds a finished run (its decision) stamped with this config and code.
    Returns the wall seconds of the run made now, None when the finished one stands.
    SystemExit naming the log when the pipeline fails (exit 1, a NO-GO, is a finished run)."""
    stamp = run_dir.with_name(f"{run_dir.name}.made_from")
    wanted = made_from(config, overrides)
    if ((run_dir / "decide_go_no_go" / "decision.json").is_file() and stamp.is_file()
            and stamp.read_text() == wanted):
        return None
    stamp.unlink(missing_ok=True)  # a run that stops half-way is not read as this one
    started = time.perf_counter()
    code = run_pipeline([config, *overrides], log)
    if code not in (0, 1):
        raise SystemExit(f"{run_dir}: pipeline exited {code}; see {log}")
    stamp.write_text(wanted)
    return time.perf_counter() - started


def run_pipeline(args: Sequence[str], log: Path) -> int:
    """`flows/pipeline.py --config ARGS...` offline, its output in `log`; its exit code."""
    env = {**os.environ, **OFFLINE, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        return subprocess.run([sys.executable, str(ROOT / "flows" / "pipeline.py"), "--config",
                               *args], cwd=ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT, check=False).returncode
