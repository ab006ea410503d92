"""Cold start: a tokenizer and tiny causal LM for the corpus, taught the tag format by a short
SFT on scripted demonstrations (see `demos.py`), before RL.

The SFT loss is the token-mean negative log-likelihood over policy-written tokens: the mask
is built per segment in lockstep with the tokens (prompt and inserted `<information>` blocks
are 0), exactly as rollouts build theirs. A from-scratch model may add `context_loss_weight`
times the token-mean NLL of the context tokens (prompt and passages): plain language
modelling on text that repeats names ("X. X is a painter. X was born in Y.") is what teaches
a tiny transformer to copy from its context, which masked SFT alone (a few target tokens per
demo) does not within a CPU budget. Questions and answers are only ever training demos, never
the evaluation split's; with `train.sft.corpus_lm` the retrieval corpus itself (which holds
every split's facts, as Wikipedia does for a real base model) is language-modelled too, and
the no-search baseline measures whether any fact was memorised from it. For a real base model
SFT is optional (`train.sft.enabled`); nothing here assumes the tiny model.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from searchrl.config import SFTConfig
from searchrl.datasets.io import publish_dir
from searchrl.train.cold_start.demos import Demo
from searchrl.train.tensors import token_logprobs


@dataclass(frozen=True)
class TokenizedDemo:
    input_ids: list[int]
    loss_mask: list[int]  # per input token: 1 iff written by the policy


@dataclass
class SFTResult:
    losses: list[float] = field(default_factory=list)  # one per optimiser step
    steps: int = 0
    tokens_trained: int = 0
    seconds: float = 0.0


def tokenize_demo(demo: Demo, tokenizer: PreTrainedTokenizerBase, max_len: int) -> TokenizedDemo:
    """Tokenize segment by segment (as rollouts do) so the mask lines up token for token.

    Raises ValueError when the demo exceeds `max_len` tokens (truncating would cut the answer,
    the part the demo is for); raise `max_len` or shorten the info budget.
    """
    ids: list[int] = []
    mask: list[int] = []
    for i, (text, trainable) in enumerate(demo.segments):
        # The first segment (the prompt) with the tokenizer's special tokens, as the rollout
        # encodes its prompt: a model with a BOS (the MiniLM prior's [CLS]) must learn from
        # demonstrations that start the way its rollouts start.
        seg = tokenizer(text, add_special_tokens=i == 0)["input_ids"]
        ids.extend(seg)
        mask.extend([int(trainable)] * len(seg))
    if len(ids) > max_len:
        raise ValueError(f"demo for {demo.example_id} is {len(ids)} tokens, over max_len "
                         f"{max_len}; raise train.sft.max_len or lower rollout.info_token_budget")
    return TokenizedDemo(ids, mask)


def collate_demos(items: Sequence[TokenizedDemo], pad_id: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = max(len(d.input_ids) for d in items)
    ids = torch.full((len(items), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(items), length), dtype=torch.long)
    target_mask = torch.zeros((len(items), length - 1))
    for i, d in enumerate(items):
        n = len(d.input_ids)
        ids[i, :n] = torch.tensor(d.input_ids)
        attn[i, :n] = 1
        # Target j is input token j + 1: it is learnt iff the policy wrote that token.
        target_mask[i, : n - 1] = torch.tensor(d.loss_mask[1:], dtype=torch.float32)
    return ids, attn, target_mask


def masked_nll(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor,
               target_mask: torch.Tensor, context_weight: float = 0.0,
               context_mask: torch.Tensor | None = None, *,
               totals: tuple[float, float] | None = None) -> torch.Tensor:
    """Token-mean NLL over `target_mask` (targets in `[N, L-1]` coordinates), plus
    `context_weight` x the token-mean NLL over `context_mask` (default: every other real,
    non-pad target). `totals` = (target tokens, context tokens) of the whole batch when these
    rows are one micro-batch of it (default: this tensor's own counts)."""
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
    logp = token_logprobs(logits, ids)  # [N, L-1]
    if context_weight > 0.0 and context_mask is None:
        context_mask = attn[:, 1:].to(logp.dtype) * (1.0 - target_mask)  # [N, L-1]
    if totals is None:
        totals = (float(target_mask.sum()),
                  float(context_mask.sum()) if context_mask is not None else 0.0)
    loss = -(logp * target_mask).sum() / max(totals[0], 1.0)
    if context_weight > 0.0 and context_mask is not None:
        loss = loss - context_weight * ((logp * context_mask).sum() / max(totals[1], 1.0))
    return loss


def batch_loss_backward(model: torch.nn.Module, items: Sequence[TokenizedDemo], pad_id: int,
                        cfg: SFTConfig, skip_ids: Sequence[int]) -> float:
    """Backward of one batch's loss, accumulated over micro-batches of
    `cfg.micro_batch_size` rows of the demos sorted by length (each padded only to its own
    longest; None: one pass over the batch as given); every micro-batch divides by the whole
    batch's token counts, so the gradient is the batch's. Returns the batch loss;
    FloatingPointError if it is not finite."""
    size = cfg.micro_batch_size or len(items)
    # One pass keeps the batch's own row order (the exact numbers of an unsplit batch).
    ordered = sorted(items, key=lambda d: len(d.input_ids)) if size < len(items) else items
    device = next(model.parameters()).device  # where the caller put the model (run.device)
    micro = []
    for start in range(0, len(ordered), size):
        ids, attn, tmask = (t.to(device) for t in
                            collate_demos(ordered[start:start + size], pad_id))
        cmask = (context_targets(ids, attn, tmask, skip_ids)
                 if cfg.context_loss_weight > 0.0 else None)
        micro.append((ids, attn, tmask, cmask))
    totals = (sum(float(t.sum()) for _, _, t, _ in micro),
              sum(float(c.sum()) for *_, c in micro if c is not None))
    total = 0.0
    for ids, attn, tmask, cmask in micro:
        loss = masked_nll(model, ids, attn, tmask, cfg.context_loss_weight, cmask,
                          totals=totals)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"SFT loss became {loss.item()}")
        loss.backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach())
    return total


def context_targets(ids: torch.Tensor, attn: torch.Tensor, target_mask: torch.Tensor,
                    skip_ids: Sequence[int]) -> torch.Tensor:
    """`[N, L-1]` mask of context targets for the LM loss: real, not policy-written, and not
    one of `skip_ids` (the protocol tags: the policy must never learn to write
    `<information>` itself, only to read what follows it)."""
    targets = ids[:, 1:]
    keep = attn[:, 1:].bool() & (target_mask == 0)
    if skip_ids:
        skip = torch.tensor(list(skip_ids), dtype=targets.dtype, device=targets.device)
        keep &= ~torch.isin(targets, skip)
    return keep.to(target_mask.dtype)


def run_sft(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
            demos: Sequence[Demo | TokenizedDemo], cfg: SFTConfig, *, seed: int = 0,
            on_step: Callable[[int, float], None] | None = None,
            progress: bool = True) -> SFTResult:
    """Train `model` in place, on the device it is on, on `demos` for `cfg.epochs` epochs
    (AdamW, cosine decay), with a progress bar (the demo's cold start is minutes of it). A
    `TokenizedDemo` is trained on as given (rejection sampling's rollouts: their own token ids
    and loss mask).

    Raises FloatingPointError on a non-finite loss (a diverged cold start is not worth saving).
    """
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("tokenizer has no pad token; set tokenizer.pad_token before SFT")
    data = [d if isinstance(d, TokenizedDemo) else tokenize_demo(d, tokenizer, cfg.max_len)
            for d in demos]
    if not data:
        raise ValueError("no demonstrations to train on")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    skip = [int(i) for i in tokenizer.all_special_ids]
    steps_per_epoch = math.ceil(len(data) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / total)))
    result = SFTResult()
    start = time.perf_counter()
    model.train()
    bar = tqdm(total=total, desc="sft", unit="step", disable=not progress)
    for _ in range(cfg.epochs):
        order = list(range(len(data)))
        rng.shuffle(order)
        for b in range(0, len(order), cfg.batch_size):
            batch = [data[i] for i in order[b : b + cfg.batch_size]]
            opt.zero_grad(set_to_none=True)
            try:
                loss = batch_loss_backward(model, batch, pad_id, cfg, skip)
            except FloatingPointError as exc:
                raise FloatingPointError(f"{exc} at step {result.steps}") from None
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            result.steps += 1
            result.tokens_trained += sum(sum(d.loss_mask[1:]) for d in batch)
            result.losses.append(loss)
            bar.update()
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if on_step is not None:
                on_step(result.steps, loss)
    bar.close()
    model.eval()  # type: ignore[no-untyped-call]
    result.seconds = time.perf_counter() - start
    return result


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """save_pretrained model + tokenizer into a temp sibling, then rename: never half-written."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    publish_dir(tmp, out_dir)
