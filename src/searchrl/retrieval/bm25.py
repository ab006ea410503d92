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

import json
import logging
import math
import re
import shutil
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import IO, Any

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer
from numpy.typing import NDArray

Ranking = list[tuple[int, float]]  # (passage row, score), best first

_TOKENIZER_DIR = "tokenizer"
_RUNS_DIR = ".runs"  # `build_to`'s spilled postings, removed when it ends
# Postings scored and written per pass of `build_to` (~40 bytes each while in flight).
POSTINGS_PER_PASS = 4_000_000
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

    @classmethod
    def build_to(cls, directory: Path, chunks: Iterable[Sequence[str]], k1: float = 0.9,
                 b: float = 0.4, stopwords: str = "en",
                 postings_per_pass: int = POSTINGS_PER_PASS) -> int:
        """`build(texts).save(directory)` for texts arriving in chunks, in memory flat in
        their number: the same files, the same arrays bit for bit (tests check this).
        Returns the number of documents.

        bm25s holds every document's token ids as Python lists and builds the matrix in
        memory (~5 GB at 1M passages). Here each chunk is tokenised (one tokenizer, so the
        ids are the ones a single call gives), reduced to (token, doc, tf) postings sorted by
        token and spilled to a run file under `directory`; the column-ordered arrays are then
        written token range by token range, each range's postings read from every run file's
        matching slice, scored exactly as bm25s scores them, and appended to the .npy files.
        Memory: a chunk, `postings_per_pass` postings, and the vocabulary's size in arrays.
        """
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer = Tokenizer(stopwords=stopwords)
        runs_dir = directory / _RUNS_DIR
        runs_dir.mkdir()
        try:
            runs, df, lengths = _spill_runs(tokenizer, chunks, runs_dir)
            n_docs = len(lengths)
            retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
            idf = _idf(df, n_docs)
            _write_csc(directory, runs, df, idf, lengths, retriever, postings_per_pass)
        finally:
            shutil.rmtree(runs_dir, ignore_errors=True)
        params = {"k1": retriever.k1, "b": retriever.b, "delta": retriever.delta,
                  "method": retriever.method, "idf_method": retriever.idf_method,
                  "dtype": retriever.dtype, "int_dtype": retriever.int_dtype,
                  "num_docs": n_docs, "version": bm25s.__version__,
                  "backend": retriever.backend}
        (directory / "params.index.json").write_text(json.dumps(params, indent=4))
        (directory / "vocab.index.json").write_text(
            json.dumps(tokenizer.word_to_id, ensure_ascii=False), encoding="utf-8")
        tokenizer.save_vocab(str(directory / _TOKENIZER_DIR))
        tokenizer.save_stopwords(str(directory / _TOKENIZER_DIR))
        return n_docs

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.retriever.save(str(directory), show_progress=False)
        self.tokenizer.save_vocab(str(directory / _TOKENIZER_DIR))
        self.tokenizer.save_stopwords(str(directory / _TOKENIZER_DIR))

    @classmethod
    def load(cls, directory: Path, mmap: bool = False) -> BM25Index:
        """`mmap=True`: the score arrays stay on disk, paged in as queries touch them (a
        wiki-scale index is ~10 GB). bm25s' own copy of the vocabulary is not loaded: queries
        are tokenised by the saved tokenizer, which holds the same one."""
        retriever = bm25s.BM25.load(str(directory), mmap=mmap, show_progress=False,
                                    load_vocab=False)
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


# --- building from chunks (`BM25Index.build_to`)

@dataclass(frozen=True)
class _Run:
    """One chunk's postings on disk, sorted by (token, doc): .npy files tok, doc, tf."""

    path: Path

    def arrays(self) -> tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]]:
        return tuple(np.load(self.path / f"{name}.npy", mmap_mode="r")  # type: ignore[return-value]
                     for name in ("tok", "doc", "tf"))


def _spill_runs(tokenizer: Tokenizer, chunks: Iterable[Sequence[str]], runs_dir: Path
                ) -> tuple[list[_Run], NDArray[np.int64], NDArray[np.int64]]:
    """Tokenise chunk by chunk into sorted run files; (runs, document frequency per token,
    length of each document in tokens, as bm25s counts it)."""
    runs: list[_Run] = []
    df = np.zeros(0, dtype=np.int64)
    lengths: list[NDArray[np.int64]] = []
    n_docs = 0
    vocab = _Vocabulary(tokenizer)
    for texts in chunks:
        if not texts:
            continue
        tokens, docs, doc_len = vocab.tokenize(texts, n_docs)
        # unique (token, doc) pairs, sorted by token then doc, and how often each occurs
        pairs, tf = np.unique((tokens << 32) | docs, return_counts=True)
        tok = (pairs >> 32).astype(np.int32)
        run = _Run(runs_dir / f"{len(runs):06d}")
        run.path.mkdir()
        np.save(run.path / "tok.npy", tok)
        np.save(run.path / "doc.npy", (pairs & 0xFFFFFFFF).astype(np.int32))
        np.save(run.path / "tf.npy", tf.astype(np.int32))
        runs.append(run)
        if len(df) < vocab.size:
            df = np.concatenate([df, np.zeros(vocab.size - len(df), dtype=np.int64)])
        df += np.bincount(tok, minlength=len(df))
        lengths.append(doc_len)
        n_docs += len(texts)
    vocab.finish()
    df = np.concatenate([df, np.zeros(vocab.size - len(df), dtype=np.int64)])
    return runs, df, np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)


_BM25S_SPLITTER = r"(?u)\b\w\w+\b"  # bm25s' default Tokenizer splitter
_RUNS_OF_2 = re.compile(r"\w\w+")


class _Vocabulary:
    """bm25s' `Tokenizer.tokenize(texts, update_vocab=True)` ids, computed in bulk.

    Same rules (lower-case, the splitter's words, a known word's id, a stopword dropped, a new
    word the next id, a document without words the empty token), same ids in the same order;
    the per-word Python loop becomes one C-level dict lookup per word, with stopwords in the
    lookup as -1, and a Python step only for words not seen before. `finish` leaves the
    tokenizer's `word_to_id` as bm25s would have (no stopwords, same order).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        if tokenizer.stemmer is not None or not tokenizer.lower or tokenizer.word_to_id:
            raise ValueError("_Vocabulary reproduces a fresh lower-casing tokenizer without "
                             "a stemmer")
        self.tokenizer = tokenizer
        self.lookup: dict[str, int] = {"": 0}  # bm25s adds the empty token first
        for word in tokenizer.stopwords or ():
            self.lookup.setdefault(word, -1)
        self.size = 1

    def tokenize(self, texts: Sequence[str], first_doc: int
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """(token ids, their documents, each document's length) of the kept tokens."""
        split, get = self.tokenizer.splitter, self.lookup.get
        if getattr(split, "__self__", None) is not None and \
                split.__self__.pattern == _BM25S_SPLITTER:
            # the same words: a greedy run of 2+ word characters can only start where a run
            # starts, so the word boundaries are implied (a quarter faster)
            split = _RUNS_OF_2.findall
        words: list[str] = []
        per_doc = np.empty(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            found = split(text.lower()) or [""]
            per_doc[i] = len(found)
            words.extend(found)
        ids = list(map(get, words))
        if None in ids:
            for k, word in enumerate(words):
                if ids[k] is None:
                    known = get(word)
                    if known is None:
                        known = self.lookup[word] = self.size
                        self.size += 1
                    ids[k] = known
        tokens = np.array(ids, dtype=np.int64)
        docs = np.repeat(np.arange(first_doc, first_doc + len(texts), dtype=np.int64), per_doc)
        kept = tokens >= 0
        tokens, docs = tokens[kept], docs[kept]
        doc_len = np.bincount(docs - first_doc, minlength=len(texts)).astype(np.int64)
        empty = np.flatnonzero(doc_len == 0)
        if len(empty):  # only stopwords: the empty token, as bm25s
            tokens = np.concatenate([tokens, np.zeros(len(empty), dtype=np.int64)])
            docs = np.concatenate([docs, empty + first_doc])
            doc_len[empty] = 1
        return tokens, docs, doc_len

    def finish(self) -> None:
        self.tokenizer.word_to_id = {w: i for w, i in self.lookup.items() if i >= 0}


def _idf(df: NDArray[np.int64], n_docs: int) -> NDArray[np.float32]:
    """Lucene idf per token, computed as bm25s does (math.log, then float32)."""
    idf = np.zeros(len(df), dtype=np.float32)
    for token in np.flatnonzero(df).tolist():
        d = int(df[token])
        idf[token] = math.log(1 + (n_docs - d + 0.5) / (d + 0.5))
    return idf


def _npy_writer(path: Path, dtype: str, length: int) -> IO[bytes]:
    fh = path.open("wb")
    np.lib.format.write_array_header_1_0(fh, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
        "shape": (length,)})
    return fh


def _write_csc(directory: Path, runs: list[_Run], df: NDArray[np.int64],
               idf: NDArray[np.float32], lengths: NDArray[np.int64], retriever: bm25s.BM25,
               per_pass: int) -> None:
    """data / indices / indptr .npy files of bm25s' column-ordered score matrix (a token's
    column holds one posting per document it occurs in: `df` of them)."""
    indptr = np.zeros(len(idf) + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    np.save(directory / "indptr.csc.index.npy", indptr)
    nnz = int(indptr[-1])
    avg_doc_len = lengths.mean() if len(lengths) else np.float64(0)
    k1, b = retriever.k1, retriever.b
    cursors = [0] * len(runs)
    with _npy_writer(directory / "data.csc.index.npy", retriever.dtype, nnz) as data_fh, \
            _npy_writer(directory / "indices.csc.index.npy", retriever.int_dtype, nnz) as idx_fh:
        start = 0
        while start < len(idf):
            # the tokens [start, end) whose postings fit in one pass (at least one token)
            end = int(np.searchsorted(indptr, indptr[start] + per_pass, side="right")) - 1
            end = min(max(end, start + 1), len(idf))
            toks, docs, tfs = _read_range(runs, cursors, end)
            order = np.argsort(toks, kind="stable")  # runs are in doc order: docs stay sorted
            toks, docs, tfs = toks[order], docs[order], tfs[order]
            # bm25s' lucene score, operation for operation (float64, then float32)
            tf = tfs.astype(np.float32).astype(np.float64)
            tfc = tf / (k1 * ((1 - b) + b * lengths[docs].astype(np.float64) / avg_doc_len)
                        + tf)
            data_fh.write((idf[toks].astype(np.float64) * tfc).astype(retriever.dtype)
                          .tobytes())
            idx_fh.write(docs.astype(retriever.int_dtype).tobytes())
            start = end


def _read_range(runs: list[_Run], cursors: list[int], end: int
                ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int32]]:
    """Every run's postings of tokens below `end` from its cursor on (cursors advanced)."""
    parts: list[tuple[NDArray[Any], NDArray[Any], NDArray[Any]]] = []
    for r, run in enumerate(runs):
        tok, doc, tf = run.arrays()
        lo = cursors[r]
        hi = lo + int(np.searchsorted(tok[lo:], end, side="left"))
        parts.append((np.array(tok[lo:hi]), np.array(doc[lo:hi]), np.array(tf[lo:hi])))
        cursors[r] = hi
        del tok, doc, tf  # unmap: only this slice was read
    return (np.concatenate([p[0] for p in parts]).astype(np.int64),
            np.concatenate([p[1] for p in parts]).astype(np.int64),
            np.concatenate([p[2] for p in parts]))
