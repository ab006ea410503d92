"""vLLM backend on a GPU (auto-skipped without CUDA and vllm; never run in CPU sessions)."""

from __future__ import annotations

import pytest
import torch

from searchrl.config import RewardConfig, RolloutConfig, TinyModelConfig
from searchrl.generation.base import SamplingParams
from searchrl.generation.hf import HFGenerator
from searchrl.models.tiny import build_tiny_model, train_tokenizer
from searchrl.rl.rollout import run_rollouts
from searchrl.types import QAExample, SearchHit

pytestmark = pytest.mark.gpu

TEXTS = [f"w{i} is w{(i * 7) % 50} <search> w{i} </search> <answer> w{i} </answer>"
         for i in range(200)]


class _Searcher:
    def search_batch(self, queries, top_k):  # type: ignore[no-untyped-def]
        return [[SearchHit("d", None, f"{q} is w1", 1.0)] for q in queries]


def test_vllm_greedy_agrees_with_hf_and_refreshes_weights(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from searchrl.generation.vllm import VLLMGenerator

    tok = train_tokenizer(TEXTS, 400)
    model = build_tiny_model(TinyModelConfig(), tok, seed=0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    vgen = VLLMGenerator(str(tmp_path), tok, dtype="float32", gpu_memory_utilization=0.2)
    hgen = HFGenerator(model.cuda(), tok, device="cuda")
    contexts = [tok(f"w{i} is", add_special_tokens=False)["input_ids"] for i in range(16)]
    params = SamplingParams(max_new_tokens=12, greedy=True, stop=("</search>", "</answer>"))
    v = vgen.generate(contexts, params)
    h = hgen.generate(contexts, params)
    agree = sum(a.token_ids == b.token_ids for a, b in zip(v, h, strict=True)) / len(v)
    assert agree >= 0.75, f"vLLM and HF greedy agree on only {agree:.0%} of rows"
    for out in v:
        assert len(out.logprobs) == len(out.token_ids)

    examples = [QAExample(id=f"q{i}", question=f"what is w{i}?", golden_answers=("w1",))
                for i in range(4)]
    batch = run_rollouts(examples, vgen, _Searcher(), RolloutConfig(max_turns=2), RewardConfig(),
                         group_size=4, seed=1)
    assert len(batch.records) == 16

    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    vgen.update_weights(model)
    after = vgen.generate(contexts, params)
    assert [o.token_ids for o in after] != [o.token_ids for o in v]
