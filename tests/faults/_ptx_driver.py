"""tests/faults/_minibatch_driver.py with PPO-ptx: every optimizer step (2 mini-batches x 2
epochs per rollout batch) also replays 3 demonstrations, split over the ranks (rank 0 takes
two, rank 1 one). Same arguments and output as _driver.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tests.faults._driver as driver
import tests.faults._minibatch_driver as minibatch
from searchrl.config import PipelineConfig


def config(work_dir: Path) -> PipelineConfig:
    cfg = minibatch.config(work_dir)
    ptx = {"ptx_coef": 1.0, "ptx_worlds": 1, "ptx_demos": 10, "ptx_rows": 3}
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=ptx)})


driver.config = config

if __name__ == "__main__":
    raise SystemExit(driver.main())
