"""The trainer over two ranks: two gloo processes on CPU running the real trainer with
DeepSpeed ZeRO-2 (tests/faults/_driver.py), the layout `deepspeed --num_gpus 2` gives on GPUs.

Rank 1 gets fewer informative groups than rank 0 every step (the driver makes half its
groups zero-variance, no refills), so the ranks have different numbers of real
micro-batches; the trainer pads them to one count because ZeRO-2 reduces gradients inside
each backward, a collective every rank must join. With PPO mini-batches
(tests/faults/_minibatch_driver.py) the same holds per mini-batch, every one an optimizer step,
and with PPO-ptx on top (tests/faults/_ptx_driver.py) for the replayed rows each step adds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.faults.test_trainer_faults import DRIVER, RUN_TIMEOUT_S, _env
from tests.helpers import free_port
from tests.train_fixture import build_init_policy

pytestmark = pytest.mark.smoke


MINIBATCH_DRIVER = DRIVER.with_name("_minibatch_driver.py")
PTX_DRIVER = DRIVER.with_name("_ptx_driver.py")


def _launch(init: Path, out: Path, trace: Path, *extra: str, driver: Path = DRIVER
            ) -> list[dict[str, Any]]:
    """Both ranks of one run; each one's result JSON (rank order)."""
    port = str(free_port())
    procs, logs = [], []
    for rank in (0, 1):
        env = _env() | {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        logs.append((out.parent / f"{out.name}.rank{rank}.log").open("w"))
        procs.append(subprocess.Popen(
            [sys.executable, str(driver), "--init", str(init), "--out", str(out), "--trace",
             str(trace), *extra],
            env=env, stdout=subprocess.PIPE, stderr=logs[-1], text=True))
    results = []
    try:
        for rank, proc in enumerate(procs):
            stdout, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
            log = (out.parent / f"{out.name}.rank{rank}.log").read_text()
            assert proc.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
        for fh in logs:
            fh.close()
    return results


def _trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_init_policy(tmp_path_factory.mktemp("init") / "policy")


@pytest.mark.slow  # three two-rank launches (~45 s): CI's slow run
def test_two_ranks_shard_questions_stay_in_sync_and_resume_exactly(
        tmp_path: Path, init_dir: Path) -> None:
    full = _launch(init_dir, tmp_path / "full", tmp_path / "full.trace")
    assert [r["steps_done"] for r in full] == [4, 4]
    calls = _trace(tmp_path / "full.trace")
    by_rank = {r: [c for c in calls if c["rank"] == r] for r in (0, 1)}
    assert len(by_rank[0]) == len(by_rank[1]) == 4  # one rollout call per step, no refills
    # Each rank samples its own shard: no question is rolled out by both.
    ids = {r: {i for c in by_rank[r] for i in c["ids"]} for r in (0, 1)}
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    # Both ranks sample with the same weights at every step, and those weights change.
    assert [c["weights"] for c in by_rank[0]] == [c["weights"] for c in by_rank[1]]
    assert len({c["weights"] for c in by_rank[0]}) == 4
    ckpt = tmp_path / "full" / "checkpoints" / "step_000004"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["zero_stage"] == 2
    assert {"trainer_state.pt", "trainer_state_rank1.pt"} <= set(manifest["files"])
    # Only rank 0 writes the metrics: one line per step, not two.
    assert len((tmp_path / "full" / "metrics.jsonl").read_text().splitlines()) == 4

    part = _launch(init_dir, tmp_path / "part", tmp_path / "part.trace", "--stop-after", "2")
    assert [r["steps_done"] for r in part] == [2, 2]
    resumed = _launch(init_dir, tmp_path / "part", tmp_path / "part.trace")
    assert [r["resumed_from"] for r in resumed] == [2, 2]
    assert resumed[0]["losses"] == full[0]["losses"]
    again = _trace(tmp_path / "part.trace")
    for r in (0, 1):
        assert [c for c in again if c["rank"] == r] == by_rank[r]
    a = load_file(str(tmp_path / "full" / "policy" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "policy" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("driver", [
    pytest.param(MINIBATCH_DRIVER, id="mini_batches", marks=pytest.mark.slow),
    pytest.param(PTX_DRIVER, id="ppo_ptx", marks=pytest.mark.slow)])
def test_two_ranks_with_several_optimizer_steps_per_batch_stay_in_sync_and_resume_exactly(
        tmp_path: Path, init_dir: Path, driver: Path) -> None:
    """2 mini-batches x 2 epochs: 4 optimizer steps per rollout batch on both ranks, though
    rank 1 has fewer micro-batches in each mini-batch (it pads them at weight 0). With PPO-ptx
    each optimizer step's replayed rows are split over the ranks (uneven: 3 rows), every rank
    adds its share in the same backward, and a resumed run replays the same rows (they are
    indexed by optimizer step)."""
    def launch(out: str, *extra: str) -> list[dict[str, Any]]:
        return _launch(init_dir, tmp_path / out, tmp_path / f"{out}.trace", *extra,
                       driver=driver)

    full = launch("full")
    assert [r["steps_done"] for r in full] == [4, 4]
    calls = _trace(tmp_path / "full.trace")
    weights = {r: [c["weights"] for c in calls if c["rank"] == r] for r in (0, 1)}
    assert weights[0] == weights[1] and len(set(weights[0])) == 4
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["optimizer_steps"] == 4.0 for r in rows)
    assert all(r["ratio_max_abs_dev"] > 0.0 for r in rows)  # steps after the first moved it
    if driver == PTX_DRIVER:  # the replayed demonstrations are learnt
        nll = [r["ptx_nll"] for r in rows]
        assert nll[-1] < nll[0], nll
    else:
        assert "ptx_nll" not in rows[0]
    launch("part", "--stop-after", "2")
    resumed = launch("part")
    assert [r["resumed_from"] for r in resumed] == [2, 2]
    assert resumed[0]["losses"] == full[0]["losses"]
    a = load_file(str(tmp_path / "full" / "policy" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "policy" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
