"""How the policy is sampled: the agentic rollout loop's budgets and sampling settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from searchrl.config.base import OPERATIONAL, POLICY, Section, shapes


class RolloutConfig(Section):
    SHAPES = shapes("filter_curriculum", "train_policy", "train_run", "evaluate_policy")
    backend: Literal["hf", "vllm"] = "hf"
    group_size: int = Field(8, ge=1)
    # Search turns; after `max_turns` searches the template opens <answer> for a last turn.
    max_turns: int = Field(4, ge=1)
    max_new_tokens_per_turn: int = Field(48, ge=1)
    # Whole response (sampled + information + glue) per rollout.
    max_response_tokens: int = Field(400, ge=1)
    # Also the cold start's demonstrations' layout.
    top_k: Annotated[int, POLICY] = Field(3, ge=1)
    # Tokens of passage text per <information> block (tags not counted).
    info_token_budget: Annotated[int, POLICY] = Field(160, ge=1)
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # Rows decoded together (prompts x G are processed in chunks of this many).
    max_batch_rows: int = Field(64, ge=1)
    vllm_gpu_memory_utilization: Annotated[float, OPERATIONAL] = 0.4
    # A rollout call (a training step's sampling, a curriculum or evaluation batch) fails its
    # stage once more than this share of its search calls failed after the client's retries,
    # counted from `min_search_failures` failed calls on: a dead retriever stops the run
    # instead of training, estimating or evaluating on "Search failed" observations. A
    # successful run's result does not depend on them.
    max_search_failure_rate: Annotated[float, OPERATIONAL] = Field(0.1, ge=0.0, le=1.0)
    min_search_failures: Annotated[int, OPERATIONAL] = Field(1, ge=1)
