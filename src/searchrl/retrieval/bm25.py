"""Sparse retrieval with bm25s (Lucene BM25 over a scipy-free sparse matrix).

Rankings are returned as passage row numbers with scores; mapping rows to passages is the
index store's job. Passages with no query term in common (score 0) are not returned: a BM25
"hit" that shares nothing with the query is noise, not a result.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer

Ranking = list[tuple[int, float]]  # (passage row, score), best first

_TOKENIZER_DIR = "tokenizer"

# bm25s sets its own logger to DEBUG on import and logs every index build ("Building index
# from IDs objects") and every query with no known word (INFO): hundreds of lines in a
# pipeline run. Its warnings still show; our loggers are untouched.
logging.getLogger("bm25s").setLevel(logging.WARNING)


class BM25Index:
    """A bm25s retriever plus the tokenizer (vocabulary, stopwords) it was built with."""

    def __init__(self, retriever: bm25s.BM25, tokenizer: Tokenizer) -> None:
        self.retriever = retriever
        self.tokenizer = tokenizer

    @property
    def size(self) -> int:
        return int(self.retriever.scores["num_docs"])

    @classmethod
    def build(cls, texts: Sequence[str], k1: float = 0.9, b: float = 0.4,
              stopwords: str = "en") -> BM25Index:
        # No progress bars: bm25s draws half a dozen per build, each a burst of log lines.
        tokenizer = Tokenizer(stopwords=stopwords)
        tokens = tokenizer.tokenize(list(texts), return_as="tuple", update_vocab=True,
                                    show_progress=False)
        retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        retriever.index(tokens, show_progress=False)
        return cls(retriever, tokenizer)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.retriever.save(str(directory), show_progress=False)
        self.tokenizer.save_vocab(str(directory / _TOKENIZER_DIR))
        self.tokenizer.save_stopwords(str(directory / _TOKENIZER_DIR))

    @classmethod
    def load(cls, directory: Path, mmap: bool = False) -> BM25Index:
        retriever = bm25s.BM25.load(str(directory), mmap=mmap, show_progress=False)
        tokenizer = Tokenizer(stopwords=[])
        tokenizer.load_vocab(str(directory / _TOKENIZER_DIR))
        tokenizer.load_stopwords(str(directory / _TOKENIZER_DIR))
        return cls(retriever, tokenizer)

    def search(self, queries: Sequence[str], top_k: int, n_threads: int = 1) -> list[Ranking]:
        """Top-k (row, score) per query, best first; scores > 0 only."""
        if not queries:
            return []
        k = min(top_k, self.size)
        # update_vocab=False: query words unseen in the corpus map to the empty token.
        ids = self.tokenizer.tokenize(list(queries), return_as="ids", update_vocab=False,
                                      show_progress=False)
        docs, scores = self.retriever.retrieve(ids, k=k, show_progress=False,
                                               n_threads=n_threads)
        out: list[Ranking] = []
        for row_docs, row_scores in zip(np.asarray(docs), np.asarray(scores), strict=True):
            out.append([(int(d), float(s)) for d, s in zip(row_docs, row_scores, strict=True)
                        if s > 0])
        return out
