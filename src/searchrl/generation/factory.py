"""Build the configured `Generator` (`rollout.backend`) for a policy."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from searchrl.config import RolloutConfig
from searchrl.generation.base import Generator


def make_generator(rollout_cfg: RolloutConfig, model: PreTrainedModel,
                   tokenizer: PreTrainedTokenizerBase, *, device: str | torch.device = "cpu",
                   model_path: str | Path | None = None) -> Generator:
    """`hf`: wraps the live `model` (trainer updates are seen by the next call).
    `vllm`: loads `model_path` (a saved policy directory) into an engine; push later weights
    with `VLLMGenerator.update_weights(model)`."""
    if rollout_cfg.backend == "hf":
        from searchrl.generation.hf import HFGenerator

        return HFGenerator(model, tokenizer, device=device)
    if model_path is None:
        raise ValueError("rollout.backend=vllm needs model_path (a saved policy directory)")
    from searchrl.generation.vllm import VLLMGenerator

    return VLLMGenerator(str(model_path), tokenizer,
                         gpu_memory_utilization=rollout_cfg.vllm_gpu_memory_utilization)


def resolve_device(device: str) -> str:
    """`run.device` as a torch device string: "auto" -> "cuda" if available, else "cpu"."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device
