"""benchmarks/bench_selection.py: its replay of keep-best picks what the trainer picks (ties
keep the earlier step, early stopping, the start a candidate or not), and it refuses the
sealed world before running anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from searchrl.config import ConfigError
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def bench() -> Any:
    import runpy
    import sys

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        return runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_selection.py"))
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))


# The smoke test's curves (tests/smoke/test_best_checkpoint.py), at every 5th step.
START_BEST = {0: 0.7, 5: 0.3, 10: 0.5, 15: 0.6, 20: 0.6}
PEAK_EARLY = {0: 0.2, 5: 0.3, 10: 0.6, 15: 0.6, 20: 0.5, 25: 0.7, 30: 0.8}


@pytest.mark.parametrize(("curve", "with_start", "patience", "step"), [
    (START_BEST, True, 2, 0),     # no step beats the start: stopped after 10, the start kept
    (START_BEST, False, 2, 15),   # steps only: the best of the worse ones
    (PEAK_EARLY, True, 2, 10),    # 15 ties 10 (the earlier kept), 20 is lower: stop
    (PEAK_EARLY, True, 0, 30),    # no early stop: the later, better evaluations
])
def test_the_replay_picks_what_the_trainer_picks(bench: Any, curve: dict[int, float],
                                                 with_start: bool, patience: int,
                                                 step: int) -> None:
    assert bench["pick"](curve, with_start=with_start, patience=patience) == step


def test_the_sealed_world_is_refused_before_any_run(bench: Any, tmp_path: Path) -> None:
    def run_world(*args: Any) -> float:
        raise AssertionError("ran a pipeline on the sealed world")

    with pytest.raises(ConfigError, match="not a tuning world"):
        bench["main"](["--world-seeds", "2027", "--work", str(tmp_path)], run_world=run_world)


def test_a_cached_answer_is_keyed_by_weights_and_rollout_settings(bench: Any,
                                                                 tmp_path: Path) -> None:
    from searchrl.config import load_config

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"step 5")
    config = load_config("configs/tiny.yaml", ["data.synthetic.seed=101"])
    key = bench["answers_key"](config, weights)
    assert bench["answers_key"](config, weights) == key
    assert bench["answers_key"](load_config("configs/tiny.yaml", [
        "data.synthetic.seed=101", "rollout.top_k=2"]), weights) != key
    weights.write_bytes(b"step 5, trained again")
    assert bench["answers_key"](config, weights) != key
