"""The one rollout loop: prompts x G samples, multi-turn search, loss mask, rewards.

Used by training (sampling) and evaluation (greedy) alike. Per-sample state is explicit
(`_Sample`); each turn of a batch is:

    generate  all live rows until </search>, </answer>, EOS or their token limit
    parse     each row's turn text (policy text only) -> search | answer | invalid
    search    all queries of the turn as ONE `search_batch` call; a SearchError becomes an
              observation ("Search failed: ...") and a counted metric; past
              `rollout.max_search_failure_rate` of the calls (at least
              `rollout.min_search_failures`) the loop raises RetrieverFailedError: a dead
              retriever stops the stage instead of training or evaluating on errors
    insert    <information> top-k passages, neutralised and truncated to info_token_budget
    force     after `max_turns` searches the template opens <answer> for one last turn

Modes (the evaluation baselines share the loop):
    agentic        as above
    no_search      the template opens <answer> right after the prompt; one turn
    retrieve_once  the question's top-k go in an <information> block first, then the template
                   opens <answer>; one turn, no further search

Every segment goes through `MaskedSequence`, so ids, loss mask and logprobs are built in
lockstep and the contexts handed to the generator are exactly `prompt_ids + response_ids`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from searchrl.config import RewardConfig, RolloutConfig
from searchrl.generation.base import GenerationOutput, Generator, SamplingParams
from searchrl.retrieval.base import Searcher, SearchError
from searchrl.rl.actions import Answer, Search, extract_answer, parse_action
from searchrl.rl.masking import MaskedSequence, decode_policy_ids
from searchrl.rl.prompts import (
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    STOP_STRINGS,
    build_prompt,
    format_passages,
    format_search_error,
)
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rewards import is_correct, score
from searchrl.types import QAExample, SearchHit

Mode = Literal["agentic", "no_search", "retrieve_once"]
MODES: tuple[Mode, ...] = ("agentic", "no_search", "retrieve_once")

# Each chunk of a batch and each turn samples from its own seed (primes, so the streams of
# neighbouring chunks and turns never coincide).
_CHUNK_SEED_STRIDE = 7919
_TURN_SEED_STRIDE = 104729


@dataclass
class RolloutBatch:
    """Records question-major (G consecutive records per example) and batch statistics."""

    records: list[RolloutRecord]
    stats: dict[str, float]


@dataclass
class _Sample:
    example: QAExample
    sample_index: int
    key: str
    prompt_ids: list[int]
    seq: MaskedSequence = field(default_factory=MaskedSequence)
    turns: int = 0
    queries: list[str] = field(default_factory=list)
    doc_ids: list[list[str]] = field(default_factory=list)
    passages: list[list[str]] = field(default_factory=list)
    scores: list[list[float]] = field(default_factory=list)  # SearchHit.score per passage
    search_errors: int = 0
    final_turn: bool = False  # the template opened <answer>: this turn must answer
    forced_answer: bool = False
    done: bool = False
    finish_reason: str = ""

    def context(self) -> list[int]:
        return self.prompt_ids + self.seq.ids


@dataclass
class _Timers:
    generation_s: float = 0.0
    retrieval_s: float = 0.0
    search_calls: int = 0
    failed_calls: int = 0
    last_error: str = ""


class RetrieverFailedError(RuntimeError):
    """Too many of a rollout call's searches failed: the retriever is down or broken, so
    what the stage would train on, estimate or report is not a measurement of the policy."""


def check_search_failures(failed: int, calls: int, cfg: RolloutConfig, last_error: str
                          ) -> None:
    """Raise RetrieverFailedError when `failed` of `calls` search calls is past the limit."""
    if failed >= cfg.min_search_failures and failed > cfg.max_search_failure_rate * calls:
        raise RetrieverFailedError(
            f"{failed} of {calls} search calls failed (limit: more than "
            f"rollout.max_search_failure_rate={cfg.max_search_failure_rate:g} of them, at "
            f"least rollout.min_search_failures={cfg.min_search_failures}); last error: "
            f"{last_error}. Check that the retriever is up and answers (its log, `/health`), "
            "then re-run: finished stages are reused")


class _Glue:
    """Template glue, tokenised once per batch (never merged with neighbouring text)."""

    def __init__(self, generator: Generator) -> None:
        tok = generator.tokenizer
        self.info_open = _encode(generator, INFO_OPEN)
        self.info_close = _encode(generator, INFO_CLOSE)
        self.answer_open = _encode(generator, ANSWER_OPEN)
        self.tokenizer = tok


def _encode(generator: Generator, text: str) -> list[int]:
    return list(generator.tokenizer(text, add_special_tokens=False)["input_ids"])


def run_rollouts(examples: Sequence[QAExample], generator: Generator, searcher: Searcher,
                 rollout_cfg: RolloutConfig, reward_cfg: RewardConfig, *, group_size: int,
                 greedy: bool = False, seed: int = 0, mode: Mode = "agentic") -> RolloutBatch:
    """Roll out `group_size` samples per example; records question-major, with stats.

    Rows are processed in chunks of `rollout_cfg.max_batch_rows`. The generator's cached
    state is released at the end. Raises ValueError on bad arguments. A failed search is an
    observation (counted in `search_errors`) until the call's failures pass the configured
    limit: then RetrieverFailedError, checked after every chunk so a dead retriever fails fast.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} (got {mode!r})")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1 (got {group_size})")
    started = time.perf_counter()
    glue = _Glue(generator)
    timers = _Timers()
    prompt_cache: dict[str, list[int]] = {}
    samples: list[_Sample] = []
    for example in examples:
        if example.question not in prompt_cache:
            prompt_cache[example.question] = list(generator.tokenizer(
                build_prompt(example.question), add_special_tokens=True)["input_ids"])
        for g in range(group_size):
            samples.append(_Sample(example=example, sample_index=g, key=f"{len(samples)}",
                                   prompt_ids=prompt_cache[example.question]))
    try:
        step = rollout_cfg.max_batch_rows
        for chunk_no, start in enumerate(range(0, len(samples), step)):
            _run_chunk(samples[start:start + step], generator, searcher, rollout_cfg, glue,
                       timers, greedy=greedy, seed=seed + _CHUNK_SEED_STRIDE * chunk_no,
                       mode=mode)
            check_search_failures(timers.failed_calls, timers.search_calls, rollout_cfg,
                                  timers.last_error)
    finally:
        generator.release()
    records = [_to_record(s, glue, reward_cfg, mode) for s in samples]
    return RolloutBatch(records=records,
                        stats=_stats(records, timers, time.perf_counter() - started,
                                     1.0 if greedy else rollout_cfg.temperature))


# --- one chunk of rows, turn by turn


def _run_chunk(rows: list[_Sample], generator: Generator, searcher: Searcher,
               cfg: RolloutConfig, glue: _Glue, timers: _Timers, *, greedy: bool, seed: int,
               mode: Mode) -> None:
    if mode == "retrieve_once":
        _search_and_insert(rows, [s.example.question for s in rows], searcher, cfg, glue,
                           timers)
    if mode in ("no_search", "retrieve_once"):
        for s in rows:
            if not s.done:
                _open_answer(s, glue, forced_by="mode")
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens_per_turn,
                            temperature=cfg.temperature, top_p=cfg.top_p, greedy=greedy,
                            stop=STOP_STRINGS)
    max_ctx = generator.max_context_tokens
    turn = 0
    while True:
        live = [s for s in rows if not s.done]
        limits = []
        for s in live:
            room = cfg.max_response_tokens - len(s.seq)
            if max_ctx is not None:
                room = min(room, max_ctx - len(s.prompt_ids) - len(s.seq))
            limits.append(min(cfg.max_new_tokens_per_turn, room))
        for s, limit in zip(live, limits, strict=True):
            if limit < 1:
                s.done, s.finish_reason = True, "token_budget"
        live_limits = [(s, lim) for s, lim in zip(live, limits, strict=True) if lim >= 1]
        if not live_limits:
            return
        live = [s for s, _ in live_limits]
        t0 = time.perf_counter()
        outputs = generator.generate([s.context() for s in live], params,
                                     keys=[s.key for s in live],
                                     limits=[lim for _, lim in live_limits],
                                     seed=seed + _TURN_SEED_STRIDE * turn)
        timers.generation_s += time.perf_counter() - t0
        turn += 1
        searching: list[tuple[_Sample, str]] = []
        for s, out in zip(live, outputs, strict=True):
            query = _apply_turn(s, out, glue, cfg)
            if query is not None:
                searching.append((s, query))
        if searching:
            _search_and_insert([s for s, _ in searching], [q for _, q in searching], searcher,
                               cfg, glue, timers)
            for s, _ in searching:
                if not s.done and len(s.queries) >= cfg.max_turns:
                    _open_answer(s, glue, forced_by="max_turns")


def _apply_turn(s: _Sample, out: GenerationOutput, glue: _Glue, cfg: RolloutConfig
                ) -> str | None:
    """Record one generated turn; returns the query if the turn ends in a search."""
    s.seq.append_sampled(out.token_ids, out.logprobs)
    s.turns += 1
    text = decode_policy_ids(glue.tokenizer, out.token_ids)
    if s.final_turn:
        # The template opened <answer>; the policy's text continues it.
        text = ANSWER_OPEN + text
    action = parse_action(text)
    if isinstance(action, Answer):
        s.done = True
        s.finish_reason = "max_turns" if s.finish_reason == "max_turns" else "answer"
        return None
    if isinstance(action, Search) and not s.final_turn:
        return action.query
    s.done = True
    if s.finish_reason == "max_turns":
        return None
    s.finish_reason = {"eos": "eos", "length": "token_budget"}.get(out.finish_reason, "invalid")
    return None


def _open_answer(s: _Sample, glue: _Glue, *, forced_by: Literal["mode", "max_turns"]) -> None:
    s.seq.append_context(glue.answer_open, "forced")
    s.final_turn = True
    s.forced_answer = True
    if forced_by == "max_turns":
        s.finish_reason = "max_turns"


def _search_and_insert(rows: list[_Sample], queries: list[str], searcher: Searcher,
                       cfg: RolloutConfig, glue: _Glue, timers: _Timers) -> None:
    """One batched search for these rows; inserts an information block into each."""
    t0 = time.perf_counter()
    timers.search_calls += 1
    error: str | None = None
    hits: list[list[SearchHit]] = []
    try:
        hits = searcher.search_batch(queries, cfg.top_k)
        if len(hits) != len(queries):
            error = f"searcher returned {len(hits)} result lists for {len(queries)} queries"
    except SearchError as exc:
        error = str(exc) or type(exc).__name__
    timers.retrieval_s += time.perf_counter() - t0
    if error is not None:
        timers.failed_calls += 1
        timers.last_error = error
    for i, (s, query) in enumerate(zip(rows, queries, strict=True)):
        s.queries.append(query)
        if error is not None:
            s.search_errors += 1
            s.doc_ids.append([])
            s.passages.append([])
            s.scores.append([])
            body = format_search_error(error)
        else:
            row_hits = hits[i][:cfg.top_k]
            s.doc_ids.append([h.doc_id for h in row_hits])
            s.passages.append([format_passages([h]) for h in row_hits])
            s.scores.append([float(h.score) for h in row_hits])
            body = format_passages(row_hits)
        _insert_information(s, body, cfg, glue)


def _insert_information(s: _Sample, body: str, cfg: RolloutConfig, glue: _Glue) -> None:
    """Append `<information>body</information>` (mask 0), body truncated to fit the budgets."""
    overhead = len(glue.info_open) + len(glue.info_close)
    # Leave the policy at least one token to act on after the block.
    room = cfg.max_response_tokens - len(s.seq) - overhead - 1
    budget = min(cfg.info_token_budget, room)
    if budget < 1:
        s.done, s.finish_reason = True, "token_budget"
        return
    # Cut by the tokenizer: the same first `budget` ids (checked on every passage of a tuning
    # world and HotpotQA), without its warning that a passage longer than the model's
    # positions "will result in indexing errors" (it never reaches the model whole).
    body_ids = list(glue.tokenizer(body, add_special_tokens=False, truncation=True,
                                   max_length=budget)["input_ids"])
    s.seq.append_context(glue.info_open, "info")
    s.seq.append_context(body_ids, "info")
    s.seq.append_context(glue.info_close, "info")


# --- records and stats


def _to_record(s: _Sample, glue: _Glue, reward_cfg: RewardConfig, mode: Mode) -> RolloutRecord:
    completion = s.seq.scored_text(glue.tokenizer)
    searches = 0 if mode == "retrieve_once" else len(s.queries)
    parts = score(completion, s.example.golden_answers, searches, reward_cfg,
                  forced_answer=s.forced_answer)
    return RolloutRecord(
        example_id=s.example.id, sample_index=s.sample_index, prompt_ids=list(s.prompt_ids),
        response_ids=list(s.seq.ids), loss_mask=list(s.seq.loss_mask),
        old_logprobs=list(s.seq.logprobs),
        text=str(glue.tokenizer.decode(s.seq.ids, skip_special_tokens=False)),
        turns=s.turns, queries=list(s.queries), retrieved_doc_ids=s.doc_ids,
        answer=extract_answer(completion), reward=parts.total, reward_parts=parts.as_dict(),
        correct=is_correct(completion, s.example.golden_answers),
        search_errors=s.search_errors, finish_reason=s.finish_reason or "token_budget",
        completion=completion,
        segments=[(seg.kind, seg.start, seg.end) for seg in s.seq.segments],
        passages=s.passages, mode=mode, forced_answer=s.forced_answer,
        retrieval_scores=s.scores,
    )


def rollout_metrics(records: Sequence[RolloutRecord]) -> dict[str, float]:
    """What a set of rollouts did, averaged per rollout (counts summed where named so): the
    rollout loop's batch stats and the trainer's per-step metrics both start from these."""
    n = max(len(records), 1)
    response = sum(len(r.response_ids) for r in records)
    sampled = sum(sum(r.loss_mask) for r in records)
    searches = sum(len(r.queries) for r in records)
    errors = sum(r.search_errors for r in records)
    metrics = {
        "rollouts": float(len(records)),
        "searches_per_rollout": searches / n,
        "search_errors": float(errors),
        "search_error_rate": errors / searches if searches else 0.0,
        "format_rate": sum(r.reward_parts.get("format", 0.0) for r in records) / n,
        "malformed_rate": sum(r.reward_parts.get("malformed", 0.0) for r in records) / n,
        "forced_answer_rate": sum(r.reward_parts.get("forced", 0.0) for r in records) / n,
        "answer_rate": sum(r.answer is not None for r in records) / n,
        "em": sum(r.reward_parts.get("em", 0.0) for r in records) / n,
        "f1": sum(r.reward_parts.get("f1", 0.0) for r in records) / n,
        "correct_rate": sum(r.correct for r in records) / n,
        "reward_mean": sum(r.reward for r in records) / n,
        "turns_mean": sum(r.turns for r in records) / n,
        "response_tokens": response / n,  # mean per rollout, inserted text included
        "sampled_tokens_mean": sampled / n,  # policy tokens per rollout
        "rollout_tokens": float(sampled),  # policy tokens in all
        "mask_coverage": sampled / max(response, 1),  # share of the response the policy wrote
    }
    for reason in ("answer", "eos", "max_turns", "token_budget", "invalid"):
        metrics[f"finish_{reason}_rate"] = sum(r.finish_reason == reason for r in records) / n
    return metrics


def _stats(records: list[RolloutRecord], timers: _Timers, total_s: float,
           temperature: float) -> dict[str, float]:
    sampled = sum(sum(r.loss_mask) for r in records)
    return rollout_metrics(records) | {
        "search_calls": float(timers.search_calls),
        "time_generation_s": timers.generation_s,
        "time_retrieval_s": timers.retrieval_s,
        "time_total_s": total_s,
        "sampled_tokens_per_s": sampled / timers.generation_s if timers.generation_s else 0.0,
        "temperature": temperature,
    }
