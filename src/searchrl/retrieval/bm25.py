"""Sparse retrieval with bm25s (Lucene BM25 over a scipy-free sparse matrix).

Rankings are returned as passage row numbers with scores; mapping rows to passages is the
index store's job. Passages with no query term in common (score 0) are not returned: a BM25
"hit" that shares nothing with the query is noise, not a result.

Search scores bm25s' own precomputed sparse index (`retriever.scores`: per-token posting
lists of BM25 weights) with the same float32 sums in the same order and the same top-k
selection as `bm25s.BM25.retrieve` on its numpy backend, so rankings are identical, ties
included (tests/unit/test_retrieval.py checks this against `retrieve`). It skips what
`retrieve` does per call that a hot loop does not need: a thread pool and two progress bars
per call (the one-query path ran 2-4x slower than raw bm25s because of them) and
re-validating token ids the index's own tokenizer produced; and it selects the top k among
the matching documents only, falling back to bm25s' whole-array selection when tied scores
make the order depend on it. Figures: docs/results/retrieval_performance.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer
from numpy.typing import NDArray

Ranking = list[tuple[int, float]]  # (passage row, score), best first

_TOKENIZER_DIR = "tokenizer"
# A thread gets at least this many queries: below it, starting threads costs more than the
# scoring it spreads.
_MIN_QUERIES_PER_THREAD = 16

# bm25s sets its own logger to DEBUG on import and logs every index build ("Building index
# from IDs objects") and every query with no known word (INFO): hundreds of lines in a
# pipeline run. Its warnings still show; our loggers are untouched.
logging.getLogger("bm25s").setLevel(logging.WARNING)


class BM25Index:
    """A bm25s retriever plus the tokenizer (vocabulary, stopwords) it was built with."""

    def __init__(self, retriever: bm25s.BM25, tokenizer: Tokenizer) -> None:
        if retriever.method in retriever.methods_requiring_nonoccurrence:
            raise ValueError(f"bm25s method {retriever.method!r} is not supported: BM25Index "
                             "scores the lucene/robertson/atire variants (no non-occurrence "
                             "term); rebuild the index with BM25Index.build")
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
        """Top-k (row, score) per query, best first; scores > 0 only.

        `n_threads` > 1 splits a batch into contiguous chunks scored on that many threads
        (numpy's fancy indexing and partitioning release the GIL); every query is scored
        exactly as alone, so the result does not depend on `n_threads` or on the batch.
        """
        if not queries:
            return []
        k = min(top_k, self.size)
        if k < 1:
            return [[] for _ in queries]
        # update_vocab=False: query words unseen in the corpus map to the empty token.
        ids: list[list[int]] = self.tokenizer.tokenize(list(queries), return_as="ids",
                                                       update_vocab=False, show_progress=False)
        n_chunks = max(1, min(n_threads, len(ids) // _MIN_QUERIES_PER_THREAD))
        if n_chunks == 1:
            return self._rank_ids(ids, k)
        bounds = [len(ids) * i // n_chunks for i in range(n_chunks + 1)]
        with ThreadPoolExecutor(max_workers=n_chunks) as pool:
            parts = pool.map(lambda lo_hi: self._rank_ids(ids[lo_hi[0]:lo_hi[1]], k),
                             pairwise(bounds))
            return [ranking for part in parts for ranking in part]

    def _rank_ids(self, queries: list[list[int]], k: int) -> list[Ranking]:
        # bm25s' lucene index: CSC-like arrays, token t's postings are rows
        # indices[indptr[t]:indptr[t+1]] with precomputed weights data[same]. A row occurs
        # once per posting list, so `+=` on a fancy index equals bm25s' np.add.at.
        scores_index = self.retriever.scores
        data, indices, indptr = (scores_index["data"], scores_index["indices"],
                                 scores_index["indptr"])
        n_docs, dtype = self.size, np.dtype(self.retriever.dtype)
        out: list[Ranking] = []
        for token_ids in queries:
            scores = np.zeros(n_docs, dtype=dtype)
            for token in token_ids:  # query order, duplicates counted: as bm25s sums
                start, end = indptr[token], indptr[token + 1]
                scores[indices[start:end]] += data[start:end]
            matched = np.flatnonzero(scores > 0)
            top = _distinct_top_k(matched, scores[matched], k)
            if top is None:
                # Tied scores in the top k: their order is whatever bm25s' selection gives,
                # so run it, step for step (partition the whole array, sort the k, reverse).
                part = np.argpartition(scores, -k)[-k:]
                order = np.flip(np.argsort(scores[part]))
                rows, best = part[order], scores[part][order]
                keep = best > 0
                top = rows[keep], best[keep]
            out.append(list(zip(top[0].tolist(), top[1].tolist(), strict=True)))
        return out


def _distinct_top_k(rows: NDArray[np.int64], scores: NDArray[np.floating[Any]], k: int
                    ) -> tuple[NDArray[np.int64], NDArray[np.floating[Any]]] | None:
    """The k best (rows, scores), best first, or None when two of the k (or the k-th and the
    next) tie, i.e. when the order is not decided by the scores alone.

    Without ties the ranking is unique, so this equals bm25s' selection, which partitions the
    whole score array: on real text most documents score 0 and numpy's argpartition is slow
    on many equal values (~5 ms a query at 100k passages against ~0.6 ms for this).
    """
    if len(rows) > k:
        part = np.argpartition(scores, -(k + 1))[-(k + 1):]  # the k+1 best, unordered
        rows, scores = rows[part], scores[part]
    order = np.argsort(-scores, kind="stable")
    rows, scores = rows[order], scores[order]
    if np.any(scores[1:] == scores[:-1]):
        return None
    return rows[:k], scores[:k]
