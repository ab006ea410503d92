"""tests/faults/_driver.py with PPO mini-batches: every rollout batch is 2 mini-batches x 2
epochs (4 optimizer steps) in micro-batches of 2, so under several ranks (rank 1 has fewer
informative groups, see _driver.py) the ranks' micro-batch counts differ inside a mini-batch.
Same arguments and output as _driver.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tests.faults._driver as driver
from searchrl.config import PipelineConfig

_base_config = driver.config


def config(work_dir: Path) -> PipelineConfig:
    cfg = _base_config(work_dir)
    ppo = {"ppo_mini_batches": 2, "ppo_epochs": 2, "micro_batch_size": 2}
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=ppo)})


driver.config = config

if __name__ == "__main__":
    raise SystemExit(driver.main())
