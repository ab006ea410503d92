"""The headline world is sealed: no tuning benchmark or script names or defaults to it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from searchrl.config import ConfigError, load_config
from searchrl.datasets.tuning import default_tuning_seed, require_tuning_world

ROOT = Path(__file__).resolve().parents[2]
TUNING_BENCHMARKS = ("bench_reward_schemes.py", "bench_train.py", "bench_curriculum.py")


def test_the_demo_world_is_sealed_and_no_tuning_code_names_it() -> None:
    config = load_config(ROOT / "configs" / "tiny.yaml")
    sealed = config.data.synthetic.seed
    assert sealed not in config.data.synthetic.tuning_seeds
    pattern = re.compile(rf"(?<![\d.]){sealed}(?![\d.])")
    for path in [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").iterdir()]:
        if path.is_file():
            assert not pattern.search(path.read_text()), f"{path} names the sealed seed"


@pytest.mark.parametrize("name", TUNING_BENCHMARKS)
def test_tuning_benchmarks_run_on_tuning_worlds(name: str) -> None:
    text = (ROOT / "benchmarks" / name).read_text()
    assert "require_tuning_world(" in text and "--world-seed" in text


def test_the_guard_refuses_the_sealed_world_and_takes_a_tuning_one() -> None:
    tiny = ROOT / "configs" / "tiny.yaml"
    with pytest.raises(ConfigError, match="not a tuning world"):
        require_tuning_world(load_config(tiny))
    config = load_config(tiny)
    seed = default_tuning_seed(config)
    require_tuning_world(load_config(tiny, [f"data.synthetic.seed={seed}"]))
