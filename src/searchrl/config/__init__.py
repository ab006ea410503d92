"""Typed pipeline configuration: pydantic v2 models loaded from YAML with `key.sub=value` overrides.

Every model is frozen and rejects unknown keys, so a typo fails at load time with the file,
the dotted key and the valid options, not hours into a run. One module per section (its
stage's settings), `pipeline` assembling them, `base` the result declarations every cache
key reads, `loading` the file and overrides; every public name is re-exported here.
"""

from searchrl.config.base import (
    BUILT_BY,
    OPERATIONAL,
    POLICY,
    RESULTS,
    SEARCH,
    STAGE_NAMES,
    Bound,
    ConfigError,
    Section,
    Shapes,
    check_bounds,
    field_shapes,
    inputs_of,
    shapes,
    union_of,
)
from searchrl.config.curriculum import CurriculumConfig
from searchrl.config.data import (
    RESERVED_SET_NAMES,
    DataConfig,
    SyntheticWorldConfig,
    check_set_names,
)
from searchrl.config.engine import EngineConfig
from searchrl.config.eval import EvalConfig, FrontierConfig
from searchrl.config.gate import GateConfig
from searchrl.config.index import IndexConfig
from searchrl.config.loading import apply_overrides, load_config
from searchrl.config.model import ModelConfig, TinyModelConfig
from searchrl.config.pipeline import PipelineConfig
from searchrl.config.retention import RetentionConfig
from searchrl.config.reward import RewardConfig
from searchrl.config.rollout import RolloutConfig
from searchrl.config.run import RunConfig, TrackingConfig
from searchrl.config.train import (
    IMPERFECT_KINDS,
    ImperfectKind,
    LaunchConfig,
    RejectionSamplingConfig,
    SFTConfig,
    TrainConfig,
)
from searchrl.config.validate import GoldCheck, ValidateConfig

__all__ = [
    "BUILT_BY", "IMPERFECT_KINDS", "OPERATIONAL", "POLICY", "RESERVED_SET_NAMES", "RESULTS",
    "SEARCH", "STAGE_NAMES", "Bound", "ConfigError", "CurriculumConfig", "DataConfig",
    "EngineConfig", "EvalConfig", "FrontierConfig", "GateConfig", "GoldCheck", "ImperfectKind",
    "IndexConfig", "LaunchConfig", "ModelConfig", "PipelineConfig", "RejectionSamplingConfig",
    "RetentionConfig", "RewardConfig", "RolloutConfig", "RunConfig", "SFTConfig", "Section",
    "Shapes", "SyntheticWorldConfig", "TinyModelConfig", "TrackingConfig", "TrainConfig",
    "ValidateConfig", "apply_overrides", "check_bounds", "check_set_names", "field_shapes",
    "inputs_of", "load_config", "shapes", "union_of",
]
