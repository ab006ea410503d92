"""A `Generator` over an OpenAI-compatible `/v1/completions` endpoint (vLLM's server, a hosted
API): the frontier system, driven by the same rollout loop, prompt and retriever as every local
policy, so its accuracy and its searches are measured, not assumed.

Completions, not chat: the loop owns the transcript (prompt, the model's turns, inserted
`<information>` blocks, the forced `<answer>` glue) and needs the model to *continue* it and
stop at `</search>` / `</answer>` so the loop can insert the next block. A text completion
continues exactly that text; a chat endpoint would wrap every turn in the model's own chat
template and cannot portably continue a half-written assistant turn.

Text, not token ids: the endpoint's model has its own tokenizer. The local tokenizer (the
trained policy's unless `eval.frontier.tokenizer` names one) is the loop's codec only: a
context is decoded to text (a leading BOS dropped, tags kept) and the returned text encoded
back. The API strips the stop string from its text; it is put back: the one the server names
in `stop_reason` (vLLM), else the stop whose opening tag is the last one left open (an
unclosed `<search>` ended by EOS then reads as a search: the API cannot tell the two apart).
A re-encoded turn longer than the row's limit is cut to it (finish "length"), so the loop's
token budgets hold.

Costs are the endpoint's: each request's `usage` (prompt + completion tokens; the prompt is
re-sent, and billed, every turn) is summed per row key (`take_usage`). The endpoint gives no
token log-probabilities of ours: `logprobs` are NaN, and confidence-based audits skip it.

Failures: every request has a timeout; connection errors, 408, 429 and 5xx are retried
`retries` times with exponential backoff (at least the server's Retry-After, capped at the
timeout); any other status or a malformed answer raises `EndpointError` at once. Every
attempt counts against `max_requests`: past it `RequestBudgetExceeded` is raised before
sending, and the caller marks the system incomplete, never a silently shorter evaluation.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import httpx
from transformers import PreTrainedTokenizerBase

from searchrl.config import FrontierConfig
from searchrl.generation.base import (
    FinishReason,
    GenerationOutput,
    SamplingParams,
    row_limits,
)
from searchrl.httpx_helpers import request_json


class EndpointError(RuntimeError):
    """The endpoint failed (unreachable after retries, refused, malformed answer); the message
    names the URL and what to check."""


class RequestBudgetExceeded(EndpointError):
    """`eval.frontier.max_requests` is spent; the evaluation of this system is incomplete."""


@dataclass
class TokenUsage:
    """What one rollout row cost at the endpoint, summed over its requests."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0


@runtime_checkable
class MeteredEndpoint(Protocol):
    """A generator whose costs are measured by a remote endpoint, not by our tokenizer."""

    def take_usage(self) -> dict[str, TokenUsage]:
        """Usage per row key since the last call (then forgotten)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Answer:
    text: str
    finish: str | None
    stop_reason: Any
    prompt_tokens: int
    completion_tokens: int


class OpenAICompatGenerator:
    """`Generator` over `<base_url>/completions` (see the module docstring). Thread-safe; one
    request per row, `concurrency` in flight."""

    def __init__(self, config: FrontierConfig, tokenizer: PreTrainedTokenizerBase, *,
                 api_key: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.config = config
        self._tok = tokenizer
        self.url = config.base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, timeout=config.timeout_s, headers=headers,
                                  transport=transport)
        self._lock = threading.Lock()
        self._requests = 0
        self._usage: dict[str, TokenUsage] = {}

    @classmethod
    def from_config(cls, config: FrontierConfig,
                    tokenizer: PreTrainedTokenizerBase) -> OpenAICompatGenerator:
        """The generator for `config`, its key from `$<config.api_key_env>` when one is named."""
        key: str | None = None
        if config.api_key_env is not None:
            key = os.environ.get(config.api_key_env) or None
            if key is None:
                raise EndpointError(
                    f"eval.frontier.api_key_env={config.api_key_env}: ${config.api_key_env} is "
                    "not set; export the endpoint's key there (never put it in the config), or "
                    "set eval.frontier.api_key_env=null for an endpoint without auth")
        return cls(config, tokenizer, api_key=key)

    # --- the Generator protocol

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tok

    @property
    def max_context_tokens(self) -> int | None:
        return self.config.max_context_tokens

    @property
    def requests_made(self) -> int:
        return self._requests

    def release(self) -> None:
        """Nothing cached between turns (the endpoint keeps its own prefix cache)."""
        return None

    def close(self) -> None:
        self._http.close()

    def take_usage(self) -> dict[str, TokenUsage]:
        with self._lock:
            usage, self._usage = self._usage, {}
        return usage

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams, *,
                 keys: Sequence[str] | None = None, limits: Sequence[int] | None = None,
                 seed: int = 0) -> list[GenerationOutput]:
        if not contexts:
            return []
        n = len(contexts)
        limits_per_row = row_limits(n, params, limits)
        row_keys = list(keys) if keys is not None else [str(i) for i in range(n)]
        texts = [self._context_text(c) for c in contexts]
        workers = max(1, min(self.config.concurrency, n))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="frontier") as pool:
            futures = [pool.submit(self._complete, texts[i], params, limits_per_row[i], seed + i)
                       for i in range(n)]
            # .result() re-raises the first failure; the pool waits for the rest on exit.
            answers = [f.result() for f in futures]
        with self._lock:
            for key, answer in zip(row_keys, answers, strict=True):
                used = self._usage.setdefault(key, TokenUsage())
                used.prompt_tokens += answer.prompt_tokens
                used.completion_tokens += answer.completion_tokens
                used.requests += 1
        return [self._to_output(texts[i], answers[i], params, limits_per_row[i]) for i in range(n)]

    # --- text in, text out

    def _context_text(self, context: Sequence[int]) -> str:
        ids = [int(t) for t in context]
        bos = self._tok.bos_token_id
        if ids and bos is not None and ids[0] == bos:
            ids = ids[1:]  # the endpoint adds its own BOS, if its model uses one
        return str(self._tok.decode(ids, skip_special_tokens=False,
                                    clean_up_tokenization_spaces=False))

    def _to_output(self, context: str, answer: _Answer, params: SamplingParams,
                   limit: int) -> GenerationOutput:
        text = answer.text
        reason: FinishReason = "length" if answer.finish == "length" else "eos"
        if answer.finish == "stop":
            hit = stop_hit(context, text, params.stop, answer.stop_reason)
            if hit is not None:
                reason = "stop"
                if not text.endswith(hit):
                    text += hit
        ids = list(self._tok(text, add_special_tokens=False)["input_ids"])
        eos = self._tok.eos_token_id
        if reason == "eos" and eos is not None:
            ids.append(int(eos))  # as the local backends return the stopping token
        if len(ids) > limit:
            ids, reason = ids[:limit], "length"
        return GenerationOutput(token_ids=ids, logprobs=[math.nan] * len(ids),
                                finish_reason=reason)

    # --- HTTP

    def _reserve(self) -> None:
        with self._lock:
            if self._requests >= self.config.max_requests:
                raise RequestBudgetExceeded(
                    f"frontier request budget spent: eval.frontier.max_requests="
                    f"{self.config.max_requests} requests to {self.url} made")
            self._requests += 1

    def _complete(self, prompt: str, params: SamplingParams, limit: int, seed: int) -> _Answer:
        payload: dict[str, Any] = {
            "model": self.config.model, "prompt": prompt, "max_tokens": limit, "n": 1,
            "stop": list(params.stop),
            "temperature": 0.0 if params.greedy else params.temperature,
            "top_p": 1.0 if params.greedy else params.top_p}
        if not params.greedy:
            payload["seed"] = seed
        data = self._post("/completions", payload)
        return _parse_answer(data, f"{self.url}/completions")

    def _post(self, path: str, payload: dict[str, Any]) -> Any:
        cfg = self.config

        def send() -> httpx.Response:
            self._reserve()  # every attempt counts against the request budget
            return self._http.post(path, json=payload)

        return request_json(
            send, retries=cfg.retries, backoff_s=cfg.backoff_s, max_wait_s=cfg.timeout_s,
            where=f"frontier endpoint {self.url}{path}", error=EndpointError,
            unreachable="is the server running and eval.frontier.base_url right?",
            auth_hint=f"; check ${cfg.api_key_env}" if cfg.api_key_env else "")


class _Missing:
    """`stop_reason` absent from the answer (not the same as a null one)."""


MISSING = _Missing()


def stop_hit(context: str, text: str, stops: Sequence[str], stop_reason: Any) -> str | None:
    """The stop string that ended a turn the API reports as `finish_reason="stop"`, or None
    when it was the end of sequence.

    `stop_reason` (vLLM) names it when it is one of `stops`; a server that sends the key as
    null or a token id ended on EOS. Without the key (the OpenAI API): the closing tag whose
    opening tag (`</search>` -> `<search>`) occurs last in context + text, if it is not already
    closed after it.
    """
    if isinstance(stop_reason, str) and stop_reason in stops:
        return stop_reason
    if not isinstance(stop_reason, _Missing):
        return None  # vLLM: null (EOS) or a stop token id
    if text.endswith(tuple(stops)):
        return next(s for s in stops if text.endswith(s))
    whole = context + text
    best: tuple[int, str] | None = None
    for stop in stops:
        opener = stop.replace("</", "<", 1)
        if opener == stop:
            continue
        at = whole.rfind(opener)
        if at >= 0 and whole.find(stop, at) < 0 and (best is None or at > best[0]):
            best = (at, stop)
    return best[1] if best is not None else None


def _parse_answer(data: Any, where: str) -> _Answer:
    try:
        choice = data["choices"][0]
        usage = data["usage"]
        text = choice["text"]
        prompt_tokens, completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]
    except (KeyError, IndexError, TypeError) as exc:
        raise EndpointError(f"{where}: expected choices[0].text and usage.prompt_tokens / "
                            f"completion_tokens, got {str(data)[:300]}") from exc
    if not isinstance(text, str) or not all(isinstance(x, int) and x >= 0
                                            for x in (prompt_tokens, completion_tokens)):
        raise EndpointError(f"{where}: malformed text or usage in {str(data)[:300]}")
    return _Answer(text=text, finish=choice.get("finish_reason"),
                   stop_reason=choice.get("stop_reason", MISSING),
                   prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
