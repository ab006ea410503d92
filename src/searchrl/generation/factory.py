"""The one place any stage gets a `Generator`: curriculum estimation, training rollouts,
the trainer's dev curve and evaluation all call `make_generator`, so each honours the same
`run.device`, `model.dtype` and `rollout.backend` (a test forbids building one elsewhere)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from searchrl.config import FrontierConfig, PipelineConfig
from searchrl.generation.base import Generator


def make_generator(config: PipelineConfig, *, policy_dir: str | Path | None = None,
                   model: PreTrainedModel | None = None,
                   tokenizer: PreTrainedTokenizerBase | None = None,
                   frontier: FrontierConfig | None = None) -> Generator:
    """A generator for the policy saved in `policy_dir`, or for a live `model`, or (with
    `frontier`) for an OpenAI-compatible endpoint.

    `hf`: wraps `model` on `run.device` (the trainer's engine module: its updates are seen by
    the next call), or loads `policy_dir` in `model.dtype` onto `run.device`, in eval mode.
    `vllm`: loads `policy_dir` (a saved policy directory) into an engine in `model.dtype`;
    the trainer pushes later weights with `update_weights(model)`.
    `frontier`: `/v1/completions` of `frontier.base_url`, with `tokenizer` (else the one in
    `policy_dir`) as the rollout's text codec; `rollout.backend` does not apply.
    """
    if frontier is not None:
        from searchrl.generation.openai_compat import OpenAICompatGenerator

        if tokenizer is None:
            if policy_dir is None:
                raise ValueError("a frontier generator needs a tokenizer or policy_dir")
            tokenizer = AutoTokenizer.from_pretrained(str(policy_dir))
        return OpenAICompatGenerator.from_config(frontier, tokenizer)
    device = resolve_device(config.run.device)
    if config.rollout.backend == "vllm":
        if policy_dir is None:
            raise ValueError("rollout.backend=vllm needs policy_dir (a saved policy directory)")
        from searchrl.generation.vllm import VLLMGenerator

        tok = tokenizer or AutoTokenizer.from_pretrained(str(policy_dir))
        return VLLMGenerator(str(policy_dir), tok, dtype=config.model.dtype,
                             gpu_memory_utilization=config.rollout.vllm_gpu_memory_utilization,
                             seed=config.run.seed)
    from searchrl.generation.hf import HFGenerator

    if model is None:
        if policy_dir is None:
            raise ValueError("make_generator needs policy_dir or model")
        model, tokenizer = load_policy_on_device(config, policy_dir)
        model.train(False)
    else:
        model.to(torch.device(device))  # type: ignore[arg-type]  # transformers' stub is wrong
    if tokenizer is None:
        raise ValueError("make_generator: a live model needs its tokenizer")
    return HFGenerator(model, tokenizer, device=device)


def load_policy_on_device(config: PipelineConfig, policy_dir: str | Path
                          ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy saved in `policy_dir`, in `model.dtype`, on `run.device`: how the trainer,
    rejection sampling and the hf generator each load one."""
    from searchrl.models.tiny import load_policy

    device = torch.device(resolve_device(config.run.device))
    model, tokenizer = load_policy(policy_dir, config.model.dtype)
    model.to(device)  # type: ignore[arg-type]
    return model, tokenizer


def resolve_device(device: str) -> str:
    """`run.device` as a torch device string: "auto" -> "cuda" if available, else "cpu"."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device
