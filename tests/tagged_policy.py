"""A tiny policy that really uses the search tags, shared by the generation tests and the
search-fault tests: a word world, tag-structured two-search demos, a tokenizer trained on
them, and a tiny model briefly trained on them (so greedy and sampled rollouts search)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from searchrl.config import TinyModelConfig
from searchrl.models.tiny import build_tiny_model, train_tokenizer
from searchrl.rl.prompts import build_prompt

# Letters only: the tokenizer splits digits one by one, so "w11" would be three tokens.
WORDS = [f"w{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(60)]
DEMO = ("{prompt}<think> look up {a} </think><search> {a} </search>\n<information>Doc 1 "
        "{a} is {b}</information>\n<think> then {b} </think><search> {b} </search>\n"
        "<information>Doc 1 {b} is {c}</information>\n<answer> {c} </answer><eos>")


def demo(i: int) -> str:
    a, b, c = WORDS[i % 60], WORDS[(i * 7 + 3) % 60], WORDS[(i * 13 + 5) % 60]
    return DEMO.format(prompt=build_prompt(f"what about {a}?"), a=a, b=b, c=c)


def demo_tokenizer() -> PreTrainedTokenizerBase:
    tokenizer: PreTrainedTokenizerBase = train_tokenizer([demo(i) for i in range(200)], 400)
    return tokenizer


def searching_model(tok: PreTrainedTokenizerBase) -> PreTrainedModel:
    """60 full-batch steps on 8 demos: enough for the model to emit the tags and search."""
    model: PreTrainedModel = build_tiny_model(TinyModelConfig(n_layer=2, n_embd=64, n_head=4),
                                              tok, seed=2)
    batch = tok([demo(i) for i in range(8)], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(60):
        loss = model(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.train(False)
    return model
