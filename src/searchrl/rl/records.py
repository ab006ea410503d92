"""The per-rollout record shared by training, evaluation, curriculum and the label-noise audit."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RolloutRecord:
    """One sampled trajectory for one question.

    `response_ids` is everything after the prompt exactly as the model conditioned on it
    (sampled tokens, inserted `<information>` blocks, template glue); `loss_mask[i]` is 1 iff
    `response_ids[i]` was sampled by the policy. `old_logprobs[i]` is the sampling-time
    log-probability of a sampled token (0.0 where the mask is 0): log softmax(logits / T) at
    the sampling temperature T (1.0 when greedy), before top-p truncation.

    `text` is the whole response decoded (information blocks included, for reading and the
    audit); `completion` is what rewards saw (policy-sampled text plus the template's forced
    `<answer>` opener, never prompt or information). `segments` are `(kind, start, end)` spans
    of `response_ids` (kind: sampled | info | glue | forced). `passages[i]` are the neutralised
    passage texts returned for `queries[i]` (before token truncation), `retrieval_scores[i]`
    the retriever's scores of those hits (`SearchHit.score`, best first; empty on a search
    error; records written before the field existed load with none).
    """

    example_id: str
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    text: str
    turns: int
    queries: list[str] = field(default_factory=list)
    retrieved_doc_ids: list[list[str]] = field(default_factory=list)
    answer: str | None = None
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    correct: bool = False
    search_errors: int = 0
    # answer | eos | max_turns | token_budget | invalid (a turn ended without a usable action)
    finish_reason: str = ""
    completion: str = ""
    segments: list[tuple[str, int, int]] = field(default_factory=list)
    passages: list[list[str]] = field(default_factory=list)
    retrieval_scores: list[list[float]] = field(default_factory=list)
    mode: str = "agentic"  # agentic | no_search | retrieve_once
    forced_answer: bool = False  # the template opened the answer (baselines, max_turns)
