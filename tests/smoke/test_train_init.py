"""train.init=champion: GRPO starts from a given policy (the downloaded champion) instead of
the cold start; no cold start is built or charged, and the run's identity is the start's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.config import IndexConfig
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.world import write_world
from searchrl.retrieval.bm25 import BM25Index
from searchrl.retrieval.index_store import LocalSearcher
from searchrl.train.cold_start.build import SFT_KEY_FILE
from searchrl.train.grpo.trainer import train_policy_run
from tests.train_fixture import build_init_policy, tiny_config

pytestmark = pytest.mark.smoke


def test_train_policy_run_starts_from_the_given_policy(tmp_path: Path) -> None:
    start = build_init_policy(tmp_path / "champion")
    (start / SFT_KEY_FILE).write_text(json.dumps({"champion": "m", "version": "7"}))
    cfg = tiny_config(tmp_path, steps=1, checkpoint_every=0)
    world = generate_world(cfg.data.synthetic)
    paths = write_world(world, tmp_path / "data")
    searcher = LocalSearcher(world.passages, IndexConfig(retriever="bm25"),
                             bm25=BM25Index.build([p.contents for p in world.passages]))
    result = train_policy_run(cfg, paths["train"], paths["corpus"], searcher, start,
                              tmp_path / "out", progress=False)
    assert result.steps_done == 1 and result.sft_dir == start and result.sft_seconds == 0.0
    assert not (tmp_path / "out" / "sft").exists()  # no cold start built
    assert (result.policy_dir / "model.safetensors").is_file()
