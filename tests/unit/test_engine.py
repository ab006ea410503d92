"""The engine setting (searchrl.ray_engine): local by default and in no cache key; a Ray cluster
that cannot be reached fails at once naming its address (exit 7); a worker keeps one object
per slot. The Ray cluster itself is exercised in tests/faults/test_ray_engine.py (slow)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from searchrl.config import RESULTS, ConfigError, EngineConfig, PipelineConfig, load_config
from searchrl.exit_codes import exit_code_of
from searchrl.ray_engine import EngineError, WorkerState, open_engine


def test_local_is_the_default_and_runs_in_process() -> None:
    assert PipelineConfig().engine.kind == "local"
    with open_engine(PipelineConfig().engine) as engine:
        assert engine is None


def test_engine_is_in_no_cache_key() -> None:
    base = PipelineConfig()
    ray = PipelineConfig.model_validate({"engine": {
        "kind": "ray", "address": "ray://head:10001", "workers": 16, "worker_gpus": 1,
        "item_timeout_s": 60, "item_max_tries": 1}})
    for result in RESULTS:
        assert "engine" not in base.inputs_of(result)
        assert ray.fingerprint_of(result) == base.fingerprint_of(result), result


def test_a_bad_address_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("engine: {kind: ray}\n")
    assert load_config(path, ["engine.address=head:6379"]).engine.address == "head:6379"
    with pytest.raises(ConfigError, match=r"engine.address.*expected auto, local, host:port"):
        load_config(path, ["engine.address=my head"])


def test_unreachable_cluster_fails_fast_naming_the_address() -> None:
    pytest.importorskip("ray")
    config = EngineConfig(kind="ray", address="127.0.0.1:9", connect_timeout_s=2.0)
    started = time.perf_counter()
    with pytest.raises(EngineError, match=r"engine.address=127.0.0.1:9: Ray cluster "
                                          r"unreachable") as caught, open_engine(config):
        pass
    assert time.perf_counter() - started < 10  # not Ray's own minute of retries
    assert exit_code_of(caught.value) == 7


def test_worker_state_loads_once_per_key_and_one_object_per_slot() -> None:
    state = WorkerState()
    loaded: list[str] = []

    def load(name: str) -> object:
        loaded.append(name)
        return object()

    first = state.get("policy", "a", lambda: load("a"))
    assert state.get("policy", "a", lambda: load("a")) is first
    state.get("searcher", "s", lambda: load("s"))
    assert state.get("policy", "b", lambda: load("b")) is not first
    assert loaded == ["a", "s", "b"] and state.loads == 3
