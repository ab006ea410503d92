"""`PipelineConfig`: every section assembled, with the checks that span sections."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from searchrl.config.base import Section, inputs_of
from searchrl.config.curriculum import CurriculumConfig
from searchrl.config.data import DataConfig
from searchrl.config.engine import EngineConfig
from searchrl.config.eval import EvalConfig
from searchrl.config.gate import GateConfig
from searchrl.config.index import IndexConfig
from searchrl.config.model import ModelConfig
from searchrl.config.retention import RetentionConfig
from searchrl.config.reward import RewardConfig
from searchrl.config.rollout import RolloutConfig
from searchrl.config.run import RunConfig, TrackingConfig
from searchrl.config.train import TrainConfig
from searchrl.config.validate import ValidateConfig


class PipelineConfig(Section):
    run: RunConfig = RunConfig()
    tracking: TrackingConfig = TrackingConfig()
    data: DataConfig = DataConfig()
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    index: IndexConfig = IndexConfig()
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    gate: GateConfig = GateConfig()
    retention: RetentionConfig = RetentionConfig()
    engine: EngineConfig = EngineConfig()  # where sharded work runs (operational)

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _groups_have_variance(self) -> PipelineConfig:
        if self.rollout.group_size < 2:
            raise ValueError(f"rollout.group_size={self.rollout.group_size}: must be >= 2: "
                             "GRPO's advantage is relative to the question's group, one "
                             "sample has none and every training step would be skipped")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @property
    def registry_model_name(self) -> str:
        """The registered model's name: eval.registry_model_name, else `searchrl-<run.name>`."""
        return self.eval.registry_model_name or f"searchrl-{self.run.name}"

    def inputs_of(self, result: str) -> dict[str, Any]:
        """The config values `result` (a stage or a `BUILT_BY` artifact) depends on, nested as
        in the YAML (`{"index": {"bm25_k1": 0.9, ...}, ...}`); sections it reads nothing of
        are left out."""
        return inputs_of(self, result)

    def fingerprint_of(self, result: str) -> str:
        """sha256 of `inputs_of(result)`: the config part of a stage's or artifact's key."""
        data = json.dumps(self.inputs_of(result), sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()

    @model_validator(mode="after")
    def _tiny_needs_sft(self) -> PipelineConfig:
        if self.model.kind == "tiny" and not self.train.sft.enabled:
            raise ValueError("train.sft.enabled=false with model.kind=tiny: a tiny model is "
                             "built from scratch and RL needs the SFT cold start to start "
                             "from; set train.sft.enabled=true, or model.kind=pretrained")
        return self
