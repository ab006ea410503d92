"""The tiny trainer setup shared by the smoke tests and the fault-test driver (which runs it in
a subprocess): a small synthetic world, a 1-layer policy, and a deterministic fake rollout
function, so both exercise the real trainer on exactly the same inputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig, TinyModelConfig
from searchrl.datasets.synthetic import generate_world
from searchrl.generation.base import SamplingParams
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import RolloutBatch
from searchrl.types import QAExample

WORLD_CFG = {"seed": 5, "n_people": 24, "n_cities": 8, "n_countries": 4,
             "n_organisations": 6, "n_train": 24, "n_dev": 6, "n_test": 6}
TINY = {"vocab_size": 300, "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 256}


def tiny_config(work_dir: Path, **train: Any) -> PipelineConfig:
    """Four steps, a checkpoint every two (a kill in step 3 or 4 resumes from step 2)."""
    return PipelineConfig.model_validate({
        "run": {"device": "cpu", "work_dir": str(work_dir), "seed": 3},
        "data": {"synthetic": WORLD_CFG},
        "model": {"tiny": TINY},
        "rollout": {"group_size": 4, "max_turns": 2, "max_new_tokens_per_turn": 12,
                    "max_response_tokens": 64, "top_k": 1, "info_token_budget": 24},
        "curriculum": {"dynamic_filtering": False},
        "train": {"steps": 4, "questions_per_step": 2, "micro_batch_size": 4, "lr": 1e-2,
                  "kl_coef": 0.1, "checkpoint_every": 2, "keep_checkpoints": 3} | train,
    })


def train_examples() -> list[QAExample]:
    return list(generate_world(tiny_config(Path("/tmp")).data.synthetic).splits["train"])


def build_init_policy(out: Path) -> Path:
    """The untrained tiny starting policy (tokenizer trained on the world's corpus)."""
    from searchrl.models.tiny import build_tiny_model, train_tokenizer
    from searchrl.train.cold_start.sft import save_policy

    world = generate_world(tiny_config(Path("/tmp")).data.synthetic)
    tok = train_tokenizer([p.contents for p in world.passages], vocab_size=TINY["vocab_size"])
    save_policy(build_tiny_model(TinyModelConfig(**TINY), tok, seed=0), tok, out)
    return out


def fake_rollouts(examples: Sequence[QAExample], generator: Any, searcher: Any,
                  rollout_cfg: Any, reward_cfg: Any, *, group_size: int, greedy: bool = False,
                  seed: int = 0, mode: str = "agentic", reward_override: float | None = None
                  ) -> RolloutBatch:
    """Sample 4 tokens with the live policy, insert 3 'retrieved' tokens (mask 0), sample 4
    more; reward = share of even token ids sampled (varies within a group, so there is
    something to learn). Deterministic in `seed`, so an interrupted and an uninterrupted run
    see the same rollouts."""
    tok = generator.tokenizer
    params = SamplingParams(max_new_tokens=4)
    records = []
    for i, ex in enumerate(examples):
        prompt = list(tok(ex.question, add_special_tokens=False)["input_ids"])
        first = generator.generate([prompt] * group_size, params, seed=seed * 97 + i)
        inserted = [5, 6, 7]
        second = generator.generate([prompt + o.token_ids + inserted for o in first], params,
                                    seed=seed * 97 + i + 50)
        for g, (a, b) in enumerate(zip(first, second, strict=True)):
            sampled = a.token_ids + b.token_ids
            reward = sum(t % 2 == 0 for t in sampled) / len(sampled)
            records.append(RolloutRecord(
                example_id=ex.id, sample_index=g, prompt_ids=prompt,
                response_ids=a.token_ids + inserted + b.token_ids,
                loss_mask=[1] * len(a.token_ids) + [0] * 3 + [1] * len(b.token_ids),
                old_logprobs=a.logprobs + [0.0] * 3 + b.logprobs, text="", turns=2,
                reward=reward if reward_override is None else reward_override,
                correct=reward > 0.5))
    return RolloutBatch(records=records, stats={"time_generation_s": 0.0})
