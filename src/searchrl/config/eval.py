"""Stage 5: evaluation of the policy and every baseline, the frontier system included."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from searchrl.config.base import OPERATIONAL, Section, shapes


class FrontierConfig(Section):
    """The frontier system the gate compares with: an OpenAI-compatible endpoint (vLLM's
    server, a hosted API) driven through `/v1/completions` by the same agentic rollout loop,
    retriever and eval set as every other system. The key is read from the environment
    variable named here, never from the config."""

    SHAPES = shapes("evaluate_policy", "decide_go_no_go")
    base_url: str  # up to and including the API version, e.g. http://127.0.0.1:8001/v1
    model: str
    api_key_env: str | None = None  # None: no Authorization header (a local vLLM server)
    # The local tokenizer the loop uses as its text codec (prompt, info budget, records);
    # None: the trained policy's. Costs are counted from the endpoint's `usage`, not by it.
    tokenizer: str | None = None
    timeout_s: Annotated[float, OPERATIONAL] = Field(60.0, gt=0.0)
    # per request, on connection errors, 408, 429 and 5xx
    retries: Annotated[int, OPERATIONAL] = Field(3, ge=0)
    # doubled per retry, at least the Retry-After
    backoff_s: Annotated[float, OPERATIONAL] = Field(1.0, ge=0.0)
    # HTTP requests (retries included) one eval set may make; past it the system is marked
    # incomplete in the results and the gate fails its accuracy condition on it.
    max_requests: int = Field(5000, ge=1)
    # requests in flight (one per rollout row)
    concurrency: Annotated[int, OPERATIONAL] = Field(8, ge=1)
    max_context_tokens: int | None = Field(None, ge=1)  # in the local tokenizer's tokens
    # What the gate charges per 1k tokens of the endpoint's measured usage.
    price_per_1k_prompt_tokens: float = Field(ge=0.0)
    price_per_1k_completion_tokens: float = Field(ge=0.0)


class EvalConfig(Section):
    # The gate reads the evaluation's settings too (split, batch size, frontier, registry).
    SHAPES = shapes("evaluate_policy", "decide_go_no_go")
    split: Literal["dev", "test"] = "test"
    max_questions: int | None = Field(None, ge=1)
    # `champion` is skipped (with a note in the report) while the registry holds none.
    baselines: tuple[
        Literal["no_search", "retrieve_once", "base_agentic", "champion", "sft", "scripted",
                "rejection_sampling"], ...
    ] = ("no_search", "retrieve_once", "scripted", "sft", "rejection_sampling", "champion")
    bootstrap_samples: int = Field(1000, ge=100)
    confidence_level: float = Field(0.95, gt=0.0, lt=1.0)
    batch_size: int = Field(32, ge=1)  # questions per rollout batch; latency is per batch
    # None: `searchrl-<run.name>`, so another pipeline's champion is never compared with.
    registry_model_name: str | None = None
    champion_alias: str = "champion"
    # Label-noise audit: minimum geometric-mean probability of the answering turn; the
    # similarity from which a wrong answer is a near-miss of the gold (tier policy_error);
    # train questions (sampled) the SFT policy is rolled out on so the audit also reads the
    # train split's gold labels (0: off).
    audit_min_confidence: float = Field(0.5, ge=0.0, le=1.0)
    audit_near_miss_ratio: float = Field(0.7, ge=0.0, le=1.0)
    audit_train_questions: int = Field(32, ge=0)
    # Extra eval sets (data.extra_eval names) every system is also evaluated on, each searched
    # in its own corpus: "all" = every one the validated dataset holds, () = the split only.
    eval_sets: tuple[str, ...] | Literal["all"] = "all"
    max_questions_per_set: int | None = Field(None, ge=1)  # cap per extra set (not the split)
    # The frontier system (evaluated as `frontier` when set); the gate's accuracy condition
    # compares with it, and its cost side uses its measured tokens per query.
    frontier: FrontierConfig | None = None
