"""vLLM backend for the `Generator` protocol (GPU; optional extra `pip install 'searchrl[gpu]'`).

UNTESTED in the CPU development sessions (no GPU, vllm not installed): its check,
`tests/unit/test_generation_vllm.py` (marked `gpu`), skips without CUDA and vllm. vllm is
imported lazily so the library imports without it.

Contexts go in as token ids (`TokensPrompt`), never as text, so the no-re-tokenisation
contract holds; prefix caching plays the role of the HF backend's kept KV cache. `keys` are
not needed. Logprobs: vLLM reports them per its `logprobs_mode` (raw model logprobs by
default, i.e. temperature 1): a trainer that needs log softmax(logits / T) exactly should
recompute old logprobs with the policy (or use T = 1).

Weights: `update_weights(model)` pushes the trainer's live parameters into the engine and
resets the prefix cache (cached KV was computed with the old weights).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from searchrl.generation.base import FinishReason, GenerationOutput, SamplingParams


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "rollout.backend=vllm needs vLLM and a GPU: pip install 'searchrl[gpu]', "
            "or set rollout.backend=hf") from exc
    return vllm


class VLLMGenerator:
    """vLLM engine behind the `Generator` protocol (see the module docstring)."""

    def __init__(self, model_path: str, tokenizer: PreTrainedTokenizerBase, *,
                 gpu_memory_utilization: float = 0.4, dtype: str = "bfloat16",
                 max_model_len: int | None = None, seed: int = 0) -> None:
        vllm = _import_vllm()
        self._tok = tokenizer
        self._max_len = max_model_len
        self.llm = vllm.LLM(model=model_path, tokenizer=model_path, dtype=dtype,
                            gpu_memory_utilization=gpu_memory_utilization,
                            enable_prefix_caching=True, max_model_len=max_model_len,
                            seed=seed)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tok

    @property
    def max_context_tokens(self) -> int | None:
        if self._max_len is not None:
            return self._max_len
        config = self.llm.llm_engine.model_config
        return int(config.max_model_len)

    def release(self) -> None:
        return None

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams, *,
                 keys: Sequence[str] | None = None, limits: Sequence[int] | None = None,
                 seed: int = 0) -> list[GenerationOutput]:
        vllm = _import_vllm()
        from vllm.inputs import TokensPrompt

        n = len(contexts)
        if limits is not None and len(limits) != n:
            raise ValueError(f"{len(limits)} limits for {n} contexts")
        sampling = [
            vllm.SamplingParams(
                n=1, temperature=0.0 if params.greedy else params.temperature,
                top_p=1.0 if params.greedy else params.top_p,
                max_tokens=min(params.max_new_tokens, limits[i]) if limits else
                params.max_new_tokens,
                stop=list(params.stop), include_stop_str_in_output=True, logprobs=0,
                seed=None if params.greedy else seed + i, skip_special_tokens=False,
                spaces_between_special_tokens=False,
            )
            for i in range(n)
        ]
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in c]) for c in contexts]
        results = self.llm.generate(prompts, sampling, use_tqdm=False)
        outputs = []
        for res in results:
            comp = res.outputs[0]
            ids = [int(t) for t in comp.token_ids]
            lps = [float(step[tok].logprob) for step, tok in zip(comp.logprobs or [], ids,
                                                                   strict=False)]
            reason: FinishReason
            if comp.finish_reason == "length":
                reason = "length"
            elif comp.stop_reason is None:
                reason = "eos"
            else:
                reason = "stop"
            outputs.append(GenerationOutput(ids, lps, reason))
        return outputs

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load the trainer's current parameters into the engine; resets the prefix cache."""

        def weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in model.state_dict().items():
                yield name, tensor.detach()

        engine: Any = self.llm.llm_engine
        executor = getattr(engine, "model_executor", None)
        worker = getattr(getattr(executor, "driver_worker", None), "worker", None) or getattr(
            executor, "driver_worker", None)
        runner = getattr(worker, "model_runner", None)
        if runner is not None:
            runner.model.load_weights(weights())
        else:
            # Engine in another process (vLLM V1 multiprocessing): ship the weights to workers.
            state = list(weights())
            self.llm.collective_rpc(lambda w: w.model_runner.model.load_weights(iter(state)))
        self.llm.reset_prefix_cache()
