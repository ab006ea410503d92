"""The policy model: a tiny one built from scratch, or a pretrained one."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from searchrl.config.base import POLICY, Section


class TinyModelConfig(Section):
    # llama: the embedded default; qwen2: the architecture of the real configs' base model,
    # randomly initialised (the GPU smoke test: no weights can be downloaded here).
    architecture: Literal["llama", "qwen2"] = "llama"
    vocab_size: int = 2048
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 1024


class ModelConfig(Section):
    SHAPES = POLICY
    kind: Literal["tiny", "pretrained"] = "tiny"
    name_or_path: str | None = None
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    @model_validator(mode="after")
    def _pretrained_needs_name(self) -> ModelConfig:
        if self.kind == "pretrained" and not self.name_or_path:
            raise ValueError("model.kind=pretrained needs model.name_or_path")
        return self
