"""transformers backends for the `Generator` protocol (CPU, or one GPU without vLLM).

`HFGenerator` decodes all rows of a batch together and keeps their KV cache across turns:
when the rollout calls again with contexts that extend the previous ones (the last sampled
token + an inserted `<information>` block), only that suffix is prefilled onto the cache.

Cache layout: one batch-wide cache whose rows may contain holes. New chunks are left-padded
(so the last position of every row is a real token and its logits are the next-token
distribution), rows that stopped earlier in a turn are fed pad tokens; both are masked out
(attention 0) and do not advance the row's position ids, so every row attends to exactly its
own tokens at exactly their positions, as in a full-context forward pass.

Work not repeated: a fresh batch prefills the prefix all its prompts share (the template)
once and each distinct prompt's rest once, then fans the cache out to the rows; decoding
stops computing rows that stopped (the batch narrows once half of it has stopped).

`HFFullContextGenerator` is the plain reference: per sample, `model.generate` re-encoding the
whole context every turn. Tests and the benchmark compare the two (greedy outputs identical).

Both hold a reference to the live model, so weights the trainer updates are used by the next
call (call `release()` after an update if a batch is in flight: cached keys/values were made
with the old weights).

Over 400 lines because the cache layout above is one invariant kept across prefill, fan-out and
narrowing; the full-context reference sits beside it for the tests that compare the two.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor
from transformers import (
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.cache_utils import DynamicLayer

from searchrl.generation.base import (
    FinishReason,
    GenerationOutput,
    SamplingParams,
    StopChecker,
    row_limits,
    sample_next,
)


class _GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A `DynamicLayer` whose keys/values are views of buffers with spare room at the end.

    `DynamicLayer.update` concatenates, copying the whole cache for every decoded token
    (quadratic in the context; 12% of rollout time on the tiny model). Here an update copies
    only the new tokens; a full buffer is reallocated with `headroom` free slots, which the
    generator sets to the call's longest decode, so a turn's prefill reallocates at most once
    and its decoding never. Tight room matters: attention reading views that skip large gaps
    in the buffer ran 20% slower than over contiguous keys (2 cores, 64 rows x 170 slots).
    Anything that replaces `keys`/`values` (reorder, dropping unused slots) is adopted on the
    next update. The attention reads the same numbers in the same layout (last dim
    contiguous).
    """

    headroom = 64
    _room: tuple[Tensor, Tensor] | None = None  # keys, values buffers [B, H, capacity, D]
    _handed_out: Tensor | None = None  # the `keys` view last returned

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
               ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old = self.get_seq_length()
        new = old + key_states.shape[-2]
        # `keys` replaced since the last update (reorder, dropped slots): adopt it in a new buffer.
        room = self._room if self.keys is self._handed_out else None
        if room is None or new > room[0].shape[-2]:
            shape = (*key_states.shape[:2], new + self.headroom, key_states.shape[-1])
            keys = key_states.new_empty(shape)
            values = value_states.new_empty((*shape[:3], value_states.shape[-1]))
            if old and self.keys is not None and self.values is not None:
                keys[..., :old, :].copy_(self.keys)
                values[..., :old, :].copy_(self.values)
            room = self._room = (keys, values)
        room[0][..., old:new, :].copy_(key_states)
        room[1][..., old:new, :].copy_(value_states)
        self.keys = self._handed_out = room[0][..., :new, :]
        self.values = room[1][..., :new, :]
        return self.keys, self.values


# The forward batch narrows to the rows still decoding once at most this share of it is left:
# a narrowed batch costs one copy of those rows' cache, and every pass after it is cheaper.
_NARROW_AT = 0.5


def _full_attention_only(cache: DynamicCache) -> bool:
    """Every layer keeps every token (plain `DynamicLayer`s or ours), so slots and rows can be
    dropped or copied freely. Subclasses such as the sliding-window and quantized layers keep
    their own bookkeeping and are left alone."""
    return all(type(layer) in (DynamicLayer, _GrowingLayer) for layer in cache.layers)


def _reserve(cache: DynamicCache, slots: int) -> None:
    """Let the cache's growing layers keep `slots` free slots when they reallocate."""
    for layer in cache.layers:
        if isinstance(layer, _GrowingLayer):
            layer.headroom = slots


def _common_prefix_len(rows: Sequence[list[int]]) -> int:
    """How many leading tokens all `rows` share: as many as the lexicographically smallest
    and largest rows share (every row sorts between them)."""
    low, high = min(rows), max(rows)
    return next((j for j, (a, b) in enumerate(zip(low, high, strict=False)) if a != b),
                min(len(low), len(high)))


def _growing_cache(config: Any, headroom: int) -> DynamicCache:
    """The model's `DynamicCache`, full-attention layers replaced by `_GrowingLayer`s that
    keep `headroom` free slots when they reallocate."""
    cache = DynamicCache(config=config)
    grown: list[Any] = [_GrowingLayer() if type(layer) is DynamicLayer  # type: ignore[no-untyped-call]
                        else layer for layer in cache.layers]
    cache.layers = grown
    _reserve(cache, headroom)
    return cache


@dataclass
class _CacheState:
    keys: list[str]
    cache: DynamicCache
    attention: Tensor  # [N, W] 1 where the cache slot holds a real token of that row
    next_pos: list[int]  # per row: position id of the next real token
    cached: list[list[int]] = field(default_factory=list)  # per row: ids whose KV is cached


class _HFBackend:
    """What both transformers backends expose of the model they drive."""

    model: PreTrainedModel
    _tok: PreTrainedTokenizerBase
    _checkers: dict[tuple[str, ...], StopChecker]

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tok

    @property
    def max_context_tokens(self) -> int | None:
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value is not None else None

    def _stop_checker(self, stop: Sequence[str]) -> StopChecker:
        """One checker per stop list, kept across calls: it learns which tokens can end a
        stop string by decoding each once (per call, that was 4% of the rollout time)."""
        key = tuple(stop)
        if key not in self._checkers:
            self._checkers[key] = StopChecker(self._tok, key)
        return self._checkers[key]


class HFGenerator(_HFBackend):
    """Batched decoding with the KV cache kept across turns (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 device: str | torch.device = "cpu", *, reuse_cache: bool = True) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("tokenizer needs pad and eos tokens (set tokenizer.pad_token)")
        self.model = model
        self._tok = tokenizer
        self._checkers = {}
        self.device = torch.device(device)
        self.reuse_cache = reuse_cache
        self._state: _CacheState | None = None
        self._headroom = 64  # free KV slots a reallocation keeps: the call's longest decode
        # transformers 5.x renamed `past_key_values` to `cache`; accept both generations.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # Work counters (tokens run through the model; forward passes and the KV slots their
        # attention read: rows x cache width, holes included), for benchmarks and stats.
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.forward_calls = 0
        self.kv_slots_read = 0

    def release(self) -> None:
        self._state = None

    @torch.inference_mode()  # no autograd bookkeeping at all: ~5% faster rollouts
    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams, *,
                 keys: Sequence[str] | None = None, limits: Sequence[int] | None = None,
                 seed: int = 0) -> list[GenerationOutput]:
        n = len(contexts)
        if n == 0:
            return []
        if keys is not None and (len(keys) != n or len(set(keys)) != n):
            raise ValueError(f"keys must be {n} distinct names, one per context (got {keys})")
        limits_per_row = row_limits(n, params, limits)
        ctx = [[int(t) for t in c] for c in contexts]
        if any(not c for c in ctx):
            raise ValueError("every context needs at least one token")
        max_ctx = self.max_context_tokens
        if max_ctx is not None:
            too_long = [i for i, c in enumerate(ctx) if len(c) + limits_per_row[i] > max_ctx]
            if too_long:
                i = too_long[0]
                raise ValueError(
                    f"row {i}: context {len(ctx[i])} + {limits_per_row[i]} new tokens exceeds the "
                    f"model's {max_ctx} positions; lower rollout.max_response_tokens or the limit")
        was_training = self.model.training
        self.model.train(False)
        try:
            self._headroom = max(limits_per_row)
            state = self._reusable_state(ctx, keys)
            _reserve(state.cache, self._headroom)  # a reused cache kept its last call's room
            if any(state.cached):
                logits = self._prefill(state, [c[len(state.cached[i]):]
                                               for i, c in enumerate(ctx)])
            else:
                state, logits = self._prefill_shared(state, ctx)
            outputs = self._decode(state, logits, params, limits_per_row, seed)
        finally:
            self.model.train(was_training)
        self._state = state if (self.reuse_cache and keys is not None) else None
        return outputs

    # --- cache bookkeeping

    def _fresh_state(self, n: int, keys: Sequence[str] | None) -> _CacheState:
        return _CacheState(
            keys=list(keys) if keys is not None else [""] * n,
            cache=_growing_cache(self.model.config, self._headroom),
            attention=torch.zeros((n, 0), dtype=torch.long, device=self.device),
            next_pos=[0] * n, cached=[[] for _ in range(n)],
        )

    def _reusable_state(self, ctx: list[list[int]], keys: Sequence[str] | None) -> _CacheState:
        """The previous state restricted/reordered to `keys`, if every row extends its cache."""
        old = self._state
        self._state = None
        if old is None or keys is None or not self.reuse_cache:
            return self._fresh_state(len(ctx), keys)
        where = {k: i for i, k in enumerate(old.keys)}
        rows = [where.get(k) for k in keys]
        for c, r in zip(ctx, rows, strict=True):
            # A usable row extends its cached ids by at least one token (we need fresh logits).
            if r is None or len(c) <= len(old.cached[r]) or c[:len(old.cached[r])] != old.cached[r]:
                return self._fresh_state(len(ctx), keys)
        order = [r for r in rows if r is not None]
        index = torch.tensor(order, dtype=torch.long, device=self.device)
        if order != list(range(len(old.keys))):
            old.cache.reorder_cache(cast(torch.LongTensor, index))
        attention = old.attention.index_select(0, index)
        # Drop slots no remaining row uses (rows that left the batch leave holes behind).
        used = attention.any(dim=0)
        layers = list(old.cache.layers)
        if not bool(used.all()) and _full_attention_only(old.cache):
            keep = used.nonzero().squeeze(-1)
            for layer in layers:
                dyn = cast(DynamicLayer, layer)
                if dyn.keys is not None and dyn.values is not None:
                    dyn.keys = dyn.keys.index_select(2, keep)
                    dyn.values = dyn.values.index_select(2, keep)
            attention = attention.index_select(1, keep)
        return _CacheState(keys=list(keys), cache=old.cache, attention=attention,
                           next_pos=[old.next_pos[r] for r in order],
                           cached=[list(old.cached[r]) for r in order])

    def _forward(self, state: _CacheState, chunk: Tensor, chunk_mask: Tensor,
                 positions: Tensor) -> Tensor:
        state.attention = torch.cat([state.attention, chunk_mask], dim=1)
        self.forward_calls += 1
        self.kv_slots_read += int(state.attention.shape[0]) * int(state.attention.shape[1])
        kwargs: dict[str, Any] = {self._cache_kwarg: state.cache}
        # One new token per row: the causal part is trivial (the row attends to every cached
        # token of its own), so hand over the 4D padding mask ready-made instead of having
        # transformers build it for every decoded token.
        mask = (state.attention[:, None, None, :].bool() if chunk.shape[1] == 1
                else state.attention)
        out: Any = self.model(input_ids=chunk, attention_mask=mask,
                              position_ids=positions, use_cache=True, logits_to_keep=1,
                              **kwargs)
        logits: Tensor = out.logits[:, -1, :]
        return logits.float()

    def _prefill(self, state: _CacheState, pending: list[list[int]]) -> Tensor:
        """Feed each row's uncached suffix (left-padded); last-position logits `[N, V]`."""
        n, width = len(pending), max(len(p) for p in pending)
        chunk = torch.full((n, width), int(self._tok.pad_token_id), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        positions = torch.zeros((n, width), dtype=torch.long)
        for i, ids in enumerate(pending):
            start = width - len(ids)
            chunk[i, start:] = torch.tensor(ids, dtype=torch.long)
            mask[i, start:] = 1
            positions[i, start:] = torch.arange(state.next_pos[i], state.next_pos[i] + len(ids))
            positions[i, :start] = state.next_pos[i]
            state.next_pos[i] += len(ids)
            state.cached[i].extend(ids)
        self.prefill_tokens += sum(len(p) for p in pending)
        return self._forward(state, chunk.to(self.device), mask.to(self.device),
                             positions.to(self.device))

    def _prefill_shared(self, state: _CacheState, ctx: list[list[int]]
                        ) -> tuple[_CacheState, Tensor]:
        """Prefill what rows share once, then fan out: the prefix every context starts with
        (the prompt template, about 80% of a prompt's tokens), then the rest of each distinct
        context (G samples share a whole prompt). vLLM's prefix caching does this on GPU."""
        distinct: dict[tuple[int, ...], int] = {}
        source = [distinct.setdefault(tuple(c), len(distinct)) for c in ctx]
        contexts = [list(c) for c in distinct]
        # Every row keeps at least one token of its own to prefill: its logits come from it.
        shared = 0 if len(contexts) == 1 else min(_common_prefix_len(contexts),
                                                  min(len(c) for c in contexts) - 1)
        if len(contexts) == len(ctx) and not shared:
            return state, self._prefill(state, ctx)
        unique = self._fresh_state(1 if shared else len(contexts), None)
        if shared:
            self._prefill(unique, [contexts[0][:shared]])
            unique = self._fan_out(unique, [0] * len(contexts), [""] * len(contexts))
        logits = self._prefill(unique, [c[shared:] for c in contexts])
        if len(contexts) == len(ctx):
            return self._fan_out(unique, list(range(len(ctx))), state.keys), logits
        index = torch.tensor(source, dtype=torch.long, device=self.device)
        return self._fan_out(unique, source, state.keys), logits.index_select(0, index)

    def _fan_out(self, state: _CacheState, source: list[int], keys: list[str]) -> _CacheState:
        """A state whose row i is a copy of `state`'s row `source[i]`."""
        if source != list(range(len(state.next_pos))):
            index = torch.tensor(source, dtype=torch.long, device=self.device)
            state.cache.reorder_cache(cast(torch.LongTensor, index))
            state.attention = state.attention.index_select(0, index)
        return _CacheState(keys=keys, cache=state.cache, attention=state.attention,
                           next_pos=[state.next_pos[j] for j in source],
                           cached=[list(state.cached[j]) for j in source])

    def _decode(self, state: _CacheState, logits: Tensor, params: SamplingParams,
                limits: list[int], seed: int) -> list[GenerationOutput]:
        """Sample until every row stops; the forward batch narrows as rows stop.

        Once half the rows of the forward batch have stopped, the rest move to a batch of
        their own (a copy of their cache rows) and the stopped ones are no longer computed;
        the columns the narrowed batch adds are folded back into `state` when it narrows
        again or the turn ends. Sampling always sees all `n` rows' logits (stopped rows keep
        their last ones), so the random stream, one draw per row, does not depend on it.
        """
        n = len(limits)
        stop = self._stop_checker(params.stop)
        eos = int(self._tok.eos_token_id)
        pad = int(self._tok.pad_token_id)
        rng = None if params.greedy else torch.Generator(device=self.device).manual_seed(seed)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        finish: list[FinishReason | None] = [None] * n
        narrowable = _full_attention_only(state.cache)
        rows, batch, since = list(range(n)), state, 0  # the forward batch: `state` rows `rows`
        while True:
            next_ids, next_lp = sample_next(logits, params, rng)
            ids_list, lp_list = next_ids.tolist(), next_lp.tolist()
            alive = [False] * n
            for i in range(n):
                if finish[i] is not None:
                    continue
                tokens[i].append(ids_list[i])
                logps[i].append(lp_list[i])
                if ids_list[i] == eos:
                    finish[i] = "eos"
                elif stop.hit(tokens[i]):
                    finish[i] = "stop"
                elif len(tokens[i]) >= limits[i]:
                    finish[i] = "length"
                else:
                    alive[i] = True
            live = [i for i in range(n) if alive[i]]
            if not live:
                break
            if narrowable and len(live) <= _NARROW_AT * len(rows):
                self._fold(state, batch, rows, since)
                rows, since = live, int(state.attention.shape[1])
                batch = self._narrow(state, rows)
            # Feed this step's tokens for rows that go on; stopped rows get a masked pad.
            feed = torch.tensor([ids_list[i] if alive[i] else pad for i in rows],
                                dtype=torch.long)
            mask = torch.tensor([int(alive[i]) for i in rows], dtype=torch.long)
            positions = torch.tensor([state.next_pos[i] for i in rows], dtype=torch.long)
            for i in live:
                state.next_pos[i] += 1
                state.cached[i].append(ids_list[i])
            self.decode_tokens += len(live)
            out = self._forward(batch, feed[:, None].to(self.device),
                                mask[:, None].to(self.device),
                                positions[:, None].to(self.device))
            logits = out if batch is state else logits.index_copy(
                0, torch.tensor(rows, device=self.device), out)
        self._fold(state, batch, rows, since)
        return [GenerationOutput(tokens[i], logps[i], finish[i] or "length") for i in range(n)]

    def _narrow(self, state: _CacheState, rows: list[int]) -> _CacheState:
        """A forward batch of just `rows` of `state`: a copy of their cache rows and mask."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        cache = _growing_cache(self.model.config, self._headroom)
        # Only narrowed when every layer is a full-attention DynamicLayer (see `_decode`).
        layers = cast(list[DynamicLayer], state.cache.layers)
        for part, source in zip(cast(list[DynamicLayer], cache.layers), layers, strict=True):
            assert source.keys is not None and source.values is not None
            keys, values = source.keys.index_select(0, index), source.values.index_select(0, index)
            part.lazy_initialization(keys, values)
            part.keys, part.values = keys, values
        return _CacheState(keys=[], cache=cache, attention=state.attention.index_select(0, index),
                           next_pos=[])

    def _fold(self, state: _CacheState, batch: _CacheState, rows: list[int], since: int) -> None:
        """Append the columns `batch` (rows `rows` of `state`) added after `since` to `state`;
        the other rows get masked zero slots there (zeros: a masked value must be finite)."""
        if batch is state:
            return
        n = int(state.attention.shape[0])
        index = torch.tensor(rows, dtype=torch.long, device=self.device)

        def widen(part: Tensor) -> Tensor:
            new = part[:, :, since:] if part.dim() == 4 else part[:, since:]
            return new.new_zeros((n, *new.shape[1:])).index_copy_(0, index, new)

        parts = cast(list[DynamicLayer], batch.cache.layers)
        for full, source in zip(cast(list[DynamicLayer], state.cache.layers), parts, strict=True):
            assert source.keys is not None and source.values is not None
            full.update(widen(source.keys), widen(source.values))
        state.attention = torch.cat([state.attention, widen(batch.attention)], dim=1)


class _TextStop(StoppingCriteria):
    def __init__(self, checker: StopChecker, prompt_len: int) -> None:
        self._checker = checker
        self._prompt_len = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                 **kwargs: Any) -> torch.BoolTensor:
        hits = [self._checker.hit(row[self._prompt_len:].tolist()) for row in input_ids]
        return torch.tensor(hits, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


class HFFullContextGenerator(_HFBackend):
    """Reference backend: per sample, `model.generate` over the full context every call.

    No state is kept between calls; `keys` are ignored. Same stop rules and logprob
    definition as `HFGenerator`; sampled (non-greedy) outputs use torch's global RNG seeded
    per call, so they differ from `HFGenerator`'s.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 device: str | torch.device = "cpu") -> None:
        self.model = model
        self._tok = tokenizer
        self._checkers = {}
        self.device = torch.device(device)

    def release(self) -> None:
        return None

    @torch.inference_mode()  # no autograd bookkeeping at all: ~5% faster rollouts
    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams, *,
                 keys: Sequence[str] | None = None, limits: Sequence[int] | None = None,
                 seed: int = 0) -> list[GenerationOutput]:
        limits_per_row = row_limits(len(contexts), params, limits)
        checker = self._stop_checker(params.stop)
        eos = int(self._tok.eos_token_id)
        was_training = self.model.training
        self.model.train(False)
        outputs = []
        try:
            for i, context in enumerate(contexts):
                torch.manual_seed(seed + i)
                input_ids = torch.tensor([list(context)], dtype=torch.long, device=self.device)
                sample_kwargs: dict[str, Any] = (
                    {"do_sample": False} if params.greedy else
                    {"do_sample": True, "temperature": params.temperature,
                     "top_p": params.top_p, "top_k": 0}
                )
                out: Any = cast(Any, self.model).generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=limits_per_row[i], eos_token_id=eos,
                    pad_token_id=int(self._tok.pad_token_id),
                    stopping_criteria=StoppingCriteriaList(
                        [_TextStop(checker, input_ids.shape[1])]),
                    return_dict_in_generate=True, output_logits=True, **sample_kwargs,
                )
                new = out.sequences[0, input_ids.shape[1]:].tolist()
                temperature = 1.0 if params.greedy else params.temperature
                lps = [float(torch.log_softmax(step[0].float() / temperature, dim=-1)[tok])
                       for step, tok in zip(out.logits, new, strict=False)]
                reason: FinishReason = (
                    "eos" if new and new[-1] == eos else
                    "stop" if checker.hit(new) else "length")
                outputs.append(GenerationOutput(new, lps, reason))
        finally:
            self.model.train(was_training)
        return outputs
