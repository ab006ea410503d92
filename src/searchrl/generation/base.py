"""The `Generator` protocol the rollout loop talks to, and the sampling/stop rules backends share.

A generator continues token-id contexts. It is stateless in contract: every call passes the
full contexts (prompt + response so far, exactly as the rollout recorded them), so what the
model conditions on is by construction the concatenation the record holds. A backend may
keep a cache keyed by `keys` (the HF backend keeps its KV cache across turns, vLLM uses prefix
caching); it must verify that a new context extends the cached one and rebuild otherwise.

Stops: a row stops after the token that completes one of `params.stop` (in decoded text), at
EOS, or after its token limit. The stopping token is kept and returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to continue. `max_new_tokens` caps every row; `generate(limits=...)` may lower it."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {self.temperature}); "
                             "use greedy=True for argmax decoding")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")


@dataclass(frozen=True)
class GenerationOutput:
    """The new tokens of one row, their sampling logprobs, and why the row stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


class Generator(Protocol):
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    @property
    def max_context_tokens(self) -> int | None:
        """Most tokens (context + new) one row may hold; None when unbounded."""
        ...

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams, *,
                 keys: Sequence[str] | None = None, limits: Sequence[int] | None = None,
                 seed: int = 0) -> list[GenerationOutput]:
        """Continue every context; one output per context, in order.

        `keys` name the rows so a backend can reuse state from an earlier call whose context
        the new one extends; `limits[i]` (>= 1) lowers row i's token limit.
        """
        ...

    def release(self) -> None:
        """Drop any cached state (end of a rollout batch, or after a weight update)."""
        ...


class StopChecker:
    """Detects stop strings in decoded text, whatever tokens produced them.

    `hit` is called after every token of a row (a row stops at its first hit), so it answers
    whether the newest token completes a stop string: it decodes the tail of the row, so a
    stop string split over several tokens (a tokenizer without tag special tokens) is caught
    as well as a single special token. Fast path: a token whose own text lacks the last
    character of every stop string cannot complete one (the stop strings are ASCII, and an
    ASCII character in decoded text comes from one token's own bytes), so the tail is decoded
    only after such tokens, about one in twenty on the rollouts.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str]) -> None:
        if any(not s or not s.isascii() for s in stop):
            raise ValueError(f"stop strings must be non-empty ASCII (got {list(stop)})")
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._last_chars = frozenset(s[-1] for s in self._stop)
        self._may_complete: dict[int, bool] = {}  # token id -> its text has a last char
        # Every token decodes to >= 1 byte, so the last `max_len` tokens cover any stop string.
        self._tail = max((len(s.encode()) for s in self._stop), default=0)

    def hit(self, generated: Sequence[int]) -> bool:
        if not self._stop or not generated:
            return False
        last = int(generated[-1])
        may = self._may_complete.get(last)
        if may is None:
            text = self._tok.decode([last], skip_special_tokens=False)
            may = self._may_complete[last] = any(c in text for c in self._last_chars)
        if not may:
            return False
        tail = self._tok.decode(list(generated[-self._tail:]), skip_special_tokens=False)
        return any(s in tail for s in self._stop)


def sample_next(logits: Tensor, params: SamplingParams,
                rng: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Next tokens `[N]` and their logprobs `[N]` from last-position logits `[N, V]`.

    The logprob is log softmax(logits / T) of the chosen token (T = 1 when greedy), before
    top-p truncation: the quantity a trainer recomputes for the importance ratio.
    """
    logits = logits.float()
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    tokens = torch.multinomial(probs, 1, generator=rng).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def row_limits(n: int, params: SamplingParams, limits: Sequence[int] | None) -> list[int]:
    """Per-context token limits: `limits` capped by `params.max_new_tokens` (validated)."""
    if limits is None:
        return [params.max_new_tokens] * n
    if len(limits) != n:
        raise ValueError(f"{len(limits)} limits for {n} contexts")
    if min(limits, default=1) < 1:
        raise ValueError(f"every limit must be >= 1 (got {min(limits)})")
    return [min(params.max_new_tokens, int(x)) for x in limits]
