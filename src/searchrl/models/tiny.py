"""The embedded-default policy: a tokenizer trained on the corpus with the rollout tags as
special tokens, and a small causal LM built from a config (no weights downloaded).

For a real base model (`model.kind=pretrained`) use `load_policy`, which loads whatever
`model.name_or_path` names; nothing here assumes the tiny model.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from searchrl.config import ModelConfig, TinyModelConfig
from searchrl.models.prior import is_bundled_prior, prepare_prior

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
TAG_TOKENS = ("<think>", "</think>", "<search>", "</search>", "<information>",
              "</information>", "<answer>", "</answer>")
SPECIAL_TOKENS = (PAD, EOS, BOS, *TAG_TOKENS)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `texts`; tags are single special tokens so they never split."""
    tok = Tokenizer(models.BPE())
    # Digits one by one, as Llama and Qwen tokenizers do: a year is then four frequent tokens
    # to copy, not a rare merge the tiny model answered from its prior (issue 33: 0 of 58
    # birth years right with merged digits, tuning world 101).
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, bos_token=BOS
    )
    fast.add_special_tokens({"additional_special_tokens": list(TAG_TOKENS)})
    return fast


def build_tiny_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase,
                     seed: int = 0) -> PreTrainedModel:
    """A randomly initialised causal LM of `cfg.architecture` sized by `cfg`."""
    shape: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=cfg.n_embd, intermediate_size=cfg.n_embd * 4,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head, max_position_embeddings=cfg.n_positions,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    if cfg.architecture == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape))
    return LlamaForCausalLM(LlamaConfig(**shape))


def load_policy(path_or_name: str | Path, dtype: str = "float32"
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a saved (tiny or pretrained) policy and its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(str(path_or_name))
    model = AutoModelForCausalLM.from_pretrained(str(path_or_name),
                                                 dtype=getattr(torch, dtype))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def init_policy(cfg: ModelConfig, corpus_texts: Iterable[str], seed: int = 0
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A fresh tiny policy (tokenizer trained on the corpus) or the configured pretrained one."""
    if cfg.kind == "pretrained":
        assert cfg.name_or_path is not None
        if is_bundled_prior(cfg.name_or_path):
            # Prepared into a model directory, then loaded as any pretrained checkpoint is.
            with tempfile.TemporaryDirectory() as tmp:
                prepared = prepare_prior(corpus_texts, TAG_TOKENS, Path(tmp) / "prior", seed=seed,
                                         layers=cfg.prior.layers)
                return load_policy(prepared, cfg.dtype)
        return load_policy(cfg.name_or_path, cfg.dtype)
    tokenizer = train_tokenizer(corpus_texts, cfg.tiny.vocab_size)
    return build_tiny_model(cfg.tiny, tokenizer, seed=seed), tokenizer
