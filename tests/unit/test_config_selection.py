"""The config of the two trust fixes: best-checkpoint selection (train.keep_best and its
metric) and the gate's comparator (eval.frontier, gate.allow_stand_in_comparator), with the
defaults failing safe and the demo's explicit choices."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from searchrl.config import FrontierConfig, PipelineConfig, TrainConfig, load_config


def test_defaults_keep_the_last_step_and_refuse_a_stand_in() -> None:
    config = PipelineConfig()
    assert not config.train.keep_best and config.train.select_metric == "dev_em"
    assert config.train.select_mode == "max"
    assert config.eval.frontier is None and not config.gate.allow_stand_in_comparator


def test_keep_best_needs_a_dev_evaluation_and_a_dev_metric() -> None:
    with pytest.raises(ValidationError, match=r"train\.eval_every > 0"):
        TrainConfig(keep_best=True, eval_every=0)
    with pytest.raises(ValidationError, match="must be a dev metric"):
        TrainConfig(select_metric="reward_mean")
    assert TrainConfig(keep_best=True, eval_every=10, select_mode="min").keep_best


def test_a_frontier_endpoint_must_be_priced_and_carries_no_key() -> None:
    with pytest.raises(ValidationError, match="price_per_1k_prompt_tokens"):
        FrontierConfig.model_validate({"base_url": "http://x/v1", "model": "m"})
    with pytest.raises(ValidationError, match="api_key"):
        FrontierConfig.model_validate({"base_url": "http://x/v1", "model": "m", "api_key": "k",
                                       "price_per_1k_prompt_tokens": 0.0,
                                       "price_per_1k_completion_tokens": 0.0})


def test_the_demo_keeps_the_best_and_allows_its_labelled_stand_in() -> None:
    config = load_config("configs/tiny.yaml")
    assert config.train.keep_best and config.train.eval_every > 0
    assert config.eval.frontier is None and config.gate.allow_stand_in_comparator
    real = load_config("configs/qwen2.5-3b-8gpu.yaml")
    assert not real.gate.allow_stand_in_comparator
