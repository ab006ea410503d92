"""Build, reuse and load corpus indexes; the in-process `Searcher` rollouts use by default.

On-disk layout, one directory per corpus (the stage directory holds one per corpus name):

    <corpus_dir>/passages/    passages.jsonl  ids, titles, *neutralised* contents (returned)
                              offsets.npy     byte offset of each line (+ the end)
    <corpus_dir>/bm25/        bm25s index + its tokenizer (score arrays memory-mapped)
    <corpus_dir>/embeddings/  embeddings.npy  (normalised, row i = passage i), assembled from
                              the embedding cache (retrieval/embedding.py): vectors by passage
                              text hash, <stage dir>/embedding_cache/ (build_indexes) or
                              <corpus_dir>/embedding_cache/ (build_index alone)
    <corpus_dir>/faiss/       index.faiss
    <corpus_dir>/scan.json    poisoning scan report
    <corpus_dir>/manifest.json

Each component directory is built in a temporary sibling and carries a `manifest.json` whose
`key` holds everything its content depends on (corpus fingerprint, parameters, encoder name
and hash, faiss type). The manifest is written last and the directory renamed into place, so
a directory without a manifest is never complete; a component is reused exactly when its
manifest key matches what the config asks for, and rebuilt otherwise. Embeddings are a
separate component so changing only the faiss type does not re-embed the corpus.

The passages and BM25 components are built from the corpus streamed in chunks
(`CORPUS_CHUNK` passages), and a loaded index reads passages by offset and BM25 scores from
memory-mapped arrays, so neither building nor serving holds a wiki-scale corpus in memory
(figures: docs/results/corpus_scale.md).

Over 400 lines because each component's build, reuse (its manifest key) and load share the layout
above and are read against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from searchrl.config import IndexConfig, inputs_of
from searchrl.datasets.io import (
    DIR_MANIFEST,
    DataError,
    atomic_write_text,
    atomic_writer,
    fingerprint,
    iter_passage_chunks,
    publish_dir,
    read_manifest,
    read_passages,
    read_qa,
)
from searchrl.ray_engine import RayEngine
from searchrl.retrieval.base import Searcher
from searchrl.retrieval.bm25 import BM25Index, Ranking
from searchrl.retrieval.dense import (
    DenseIndex,
    Encoder,
    build_faiss,
    encoder_dtype,
    encoder_hash,
    faiss_params,
    prefixes,
    prepare_for_search,
)
from searchrl.retrieval.embedding import EmbeddingCache, embed_corpus
from searchrl.retrieval.hybrid import rrf_fuse
from searchrl.retrieval.scan import ScanReport, scan_corpus
from searchrl.sinks import MetricsSink
from searchrl.tags import neutralize_tags
from searchrl.types import Passage, SearchHit

FORMAT_VERSION = 1
# Bump when `neutralize_tags` changes, so stored passages are re-escaped.
NEUTRALISE_VERSION = 2
# 2: passages.jsonl has offsets.npy beside it (read by offset, not loaded whole)
PASSAGE_STORE_VERSION = 2
# Passages read at once while building the passages and BM25 components.
CORPUS_CHUNK = 50_000
MAIN_CORPUS = "main"
# Candidates each retriever contributes to a hybrid fusion, at least.
HYBRID_DEPTH = 50


class IndexStoreError(RuntimeError):
    """An index directory is missing, incomplete or does not match the config."""


# --- corpus I/O


def load_corpus(corpus_path: Path) -> list[Passage]:
    """Passages of a corpus file; duplicate ids or an empty corpus raise DataError."""
    passages = read_passages(corpus_path)
    if not passages:
        raise DataError(f"{corpus_path}: corpus has no passages")
    seen: dict[str, int] = {}
    for row, passage in enumerate(passages, start=1):
        if passage.id in seen:
            raise DataError(f"{corpus_path}: row {row}: field 'id': duplicate passage id "
                            f"{passage.id!r} (first at row {seen[passage.id]})")
        seen[passage.id] = row
    return passages


class PassageStore(Sequence[Passage]):
    """A passages component read on demand: row i is the line at byte offsets[i] of
    passages.jsonl (offsets.npy, memory-mapped), so a server holds 8 bytes a passage of it
    in memory at most, not the corpus. Thread-safe (positioned reads)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "passages.jsonl"
        offsets = directory / "offsets.npy"
        # a store built before offsets.npy existed: one pass to find the lines
        self.offsets = (np.load(offsets, mmap_mode="r") if offsets.is_file()
                        else _line_offsets(self.path))
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> Passage:  # type: ignore[override]
        if not -len(self) <= row < len(self):
            raise IndexError(f"passage row {row} out of range ({len(self)} passages)")
        row %= len(self)
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        return Passage.model_validate_json(os.pread(self._fd, end - start, start))

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


def _line_offsets(path: Path) -> np.ndarray:
    offsets, pos = [0], 0
    with path.open("rb") as fh:
        for line in fh:
            pos += len(line)
            if line.strip():
                offsets.append(pos)
            else:
                offsets[-1] = pos
    return np.asarray(offsets, dtype=np.int64)


def _duplicate_id_error(corpus_path: Path, hashes: np.ndarray) -> DataError | None:
    """load_corpus' error for the first repeated id (file order), from one hash per row;
    rows whose hashes collide are read again to compare their ids."""
    order = np.argsort(hashes, kind="stable")
    ranked = hashes[order]
    same = np.zeros(len(ranked), dtype=bool)
    same[1:] |= ranked[1:] == ranked[:-1]
    same[:-1] |= ranked[1:] == ranked[:-1]
    candidates = {int(r) for r in order[same]}
    if not candidates:
        return None
    seen: dict[str, int] = {}
    row = 0
    for chunk in iter_passage_chunks(corpus_path, CORPUS_CHUNK):
        for passage in chunk:
            row += 1
            if row - 1 not in candidates:
                continue
            if passage.id in seen:
                return DataError(f"{corpus_path}: row {row}: field 'id': duplicate passage id "
                                 f"{passage.id!r} (first at row {seen[passage.id]})")
            seen[passage.id] = row
    return None


# --- components: build in a temp dir, manifest last, rename into place


def _key_fingerprint(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _component(directory: Path, key: dict[str, Any],
               build: Callable[[Path], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """Reuse `directory` if its manifest key equals `key`, else build it atomically.

    Returns (manifest, reused). `build(tmp_dir)` writes the files and returns extra manifest
    fields; an exception (or interrupt) leaves the old complete component or nothing.
    """
    existing = read_manifest(directory, directory=True)
    if existing is not None and existing.get("key") == key:
        return existing, True
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        start = time.perf_counter()
        extra = build(tmp)
        manifest = {"key": key, "fingerprint": _key_fingerprint(key), "complete": True,
                    "build_seconds": round(time.perf_counter() - start, 3),
                    "bytes": _dir_bytes(tmp), "built_at": time.time(), **extra}
        atomic_write_text(tmp / DIR_MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
        publish_dir(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest, False


def _remove_stale_temps(out_dir: Path) -> None:
    """Leftovers of builds that were killed (a SIGKILL skips the cleanup in `_component`)."""
    if out_dir.is_dir():
        for child in out_dir.iterdir():
            if child.name.startswith(".") and (".tmp-" in child.name or ".old-" in child.name):
                shutil.rmtree(child, ignore_errors=True)


# --- keys: everything a component's content depends on


def _passages_key(corpus_fp: str) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "corpus_fingerprint": corpus_fp,
            "neutralise": NEUTRALISE_VERSION, "store": PASSAGE_STORE_VERSION}


def _bm25_key(corpus_fp: str, config: IndexConfig) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "corpus_fingerprint": corpus_fp,
            "settings": inputs_of(config, "index.bm25"), "bm25s": version("bm25s")}


def _embeddings_key(corpus_fp: str, config: IndexConfig) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "corpus_fingerprint": corpus_fp,
            "settings": inputs_of(config, "index.dense"),
            "encoder_hash": encoder_hash(config.encoder),
            "passage_prefix": prefixes(config)[1],  # None resolves by encoder name
            "dtype": encoder_dtype(config)}  # auto resolves by device


def _faiss_key(embeddings_key: dict[str, Any], config: IndexConfig) -> dict[str, Any]:
    return {**embeddings_key, "faiss": inputs_of(config, "index.faiss")}


def components_for(config: IndexConfig) -> tuple[str, ...]:
    """Which retrievers to build: what `retriever` needs, or all when evaluating all."""
    if config.eval_all_retrievers or config.retriever == "hybrid":
        return ("bm25", "dense")
    return (config.retriever,)


# --- the in-process searcher


class LocalSearcher:
    """BM25, dense or hybrid search over one corpus, in this process.

    `search_batch` follows the `Searcher` protocol with `config.retriever`; `rank` gives any
    built retriever's raw rankings (for recall measurement). Returned contents and titles are
    neutralised (rollout tags escaped).
    """

    def __init__(self, passages: Sequence[Passage], config: IndexConfig,
                 bm25: BM25Index | None = None, dense: DenseIndex | None = None) -> None:
        self.passages: Sequence[Passage] = (passages if isinstance(passages, PassageStore)
                                            else list(passages))
        self.config = config
        self.bm25 = bm25
        self.dense = dense
        self.retriever = config.retriever

    @property
    def size(self) -> int:
        return len(self.passages)

    def available(self) -> tuple[str, ...]:
        have = [name for name, idx in (("bm25", self.bm25), ("dense", self.dense)) if idx]
        return (*have, "hybrid") if len(have) == 2 else tuple(have)

    def rank(self, queries: Sequence[str], top_k: int, retriever: str | None = None
             ) -> list[Ranking]:
        retriever = retriever or self.retriever
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1 (got {top_k})")
        if retriever not in self.available():
            raise IndexStoreError(f"retriever {retriever!r} was not built for this index "
                              f"(built: {self.available()}); rebuild with "
                              f"index.retriever={retriever} or index.eval_all_retrievers=true")
        if retriever == "bm25":
            assert self.bm25 is not None
            return self.bm25.search(queries, top_k, n_threads=self.config.bm25_threads)
        if retriever == "dense":
            assert self.dense is not None
            return self.dense.search(queries, top_k)
        assert self.bm25 is not None and self.dense is not None
        depth = max(top_k, HYBRID_DEPTH)
        return rrf_fuse({"bm25": self.bm25.search(queries, depth,
                                                  n_threads=self.config.bm25_threads),
                         "dense": self.dense.search(queries, depth)},
                        self.config.hybrid_weights, top_k=top_k, k=self.config.rrf_k)

    def to_hits(self, rankings: list[Ranking]) -> list[list[SearchHit]]:
        return [[_hit(self.passages[row], score) for row, score in ranking]
                for ranking in rankings]

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        return self.to_hits(self.rank(queries, top_k))


def _hit(passage: Passage, score: float) -> SearchHit:
    return SearchHit(doc_id=passage.id, title=passage.title, contents=passage.contents,
                     score=score)


# --- building


@dataclass
class IndexBuildResult:
    """What `build_index` built for one corpus."""

    name: str
    index_dir: Path
    fingerprint: str
    passages: int
    components: dict[str, bool] = field(default_factory=dict)  # component -> reused?
    build_seconds: float = 0.0
    index_bytes: int = 0
    recall: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)
    scan: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat metric dict, names prefixed by the corpus name."""
        out = {f"{self.name}.passages": float(self.passages),
               f"{self.name}.build_seconds": self.build_seconds,
               f"{self.name}.index_bytes": float(self.index_bytes),
               f"{self.name}.flagged_tag": float(self.scan.get("flagged_tag", 0)),
               f"{self.name}.flagged_injection": float(self.scan.get("flagged_injection", 0))}
        for eval_name, by_retriever in self.recall.items():
            for retriever, by_k in by_retriever.items():
                for k, value in by_k.items():
                    out[f"{self.name}.{eval_name}.{retriever}.recall_at_{k}"] = value
        return out


class _Components:
    """One corpus's index components under `out_dir`, each reused while its key matches
    (`_component`); the corpus is parsed only if some component must be built."""

    def __init__(self, corpus_path: Path, out_dir: Path, config: IndexConfig,
                 progress: bool, embedding_cache: Path | None = None,
                 engine: RayEngine | None = None) -> None:
        self.corpus_path, self.out_dir, self.config = corpus_path, out_dir, config
        self.progress, self.engine = progress, engine
        self.embedding_cache = embedding_cache or out_dir / "embedding_cache"
        self.corpus_fp = fingerprint(corpus_path)
        self.manifests: dict[str, dict[str, Any]] = {}
        self.reused: dict[str, bool] = {}
        self.encoder: Encoder | None = None  # loaded for embedding, kept for recall

    def build(self, wanted: Sequence[str]) -> None:
        """passages + scan always; bm25; dense: embeddings, then the faiss index over them."""
        self._add("passages", _passages_key(self.corpus_fp), self._passages)
        shutil.copyfile(self.out_dir / "passages" / "scan.json", self.out_dir / "scan.json")
        if "bm25" in wanted:
            self._add("bm25", _bm25_key(self.corpus_fp, self.config), self._bm25)
        if "dense" in wanted:
            emb_key = _embeddings_key(self.corpus_fp, self.config)
            self._add("embeddings", emb_key, self._embeddings)
            self._add("faiss", _faiss_key(emb_key, self.config), self._faiss)

    def _add(self, component: str, key: dict[str, Any],
             build: Callable[[Path], dict[str, Any]]) -> None:
        self.manifests[component], self.reused[component] = _component(
            self.out_dir / component, key, build)

    def _passages(self, tmp: Path) -> dict[str, Any]:
        """Neutralised passages + their offsets, and the poisoning scan, streamed; duplicate
        ids and an empty corpus raise DataError (as `load_corpus`)."""
        report = ScanReport()
        offsets: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        hashes: list[np.ndarray] = []  # 8 bytes a passage: ids unique without holding them
        end = 0
        with atomic_writer(tmp / "passages.jsonl") as fh:
            for chunk in iter_passage_chunks(self.corpus_path, CORPUS_CHUNK):
                scanned = scan_corpus(chunk)
                report.passages += scanned.passages
                report.findings.extend(scanned.findings)
                lines = [Passage(id=p.id, title=neutralize_tags(p.title) if p.title else p.title,
                                 contents=neutralize_tags(p.contents)).model_dump_json()
                         .encode() + b"\n" for p in chunk]
                fh.write(b"".join(lines))
                ends = end + np.cumsum([len(line) for line in lines], dtype=np.int64)
                offsets.append(ends)
                end = int(ends[-1])
                hashes.append(np.fromiter((hash(p.id) for p in chunk), dtype=np.int64,
                                          count=len(chunk)))
        if report.passages == 0:
            raise DataError(f"{self.corpus_path}: corpus has no passages")
        duplicate = _duplicate_id_error(self.corpus_path, np.concatenate(hashes))
        if duplicate is not None:
            raise duplicate
        np.save(tmp / "offsets.npy", np.concatenate(offsets))
        atomic_write_text(tmp / "scan.json", json.dumps(report.to_dict(), indent=2))
        return {"passages": report.passages, "corpus_path": str(self.corpus_path)}

    def _bm25(self, tmp: Path) -> dict[str, Any]:
        config = self.config
        texts = ([p.contents for p in chunk]
                 for chunk in iter_passage_chunks(self.corpus_path, CORPUS_CHUNK))
        BM25Index.build_to(tmp, texts, k1=config.bm25_k1, b=config.bm25_b,
                           stopwords=config.bm25_stopwords)
        return {}

    def _embeddings(self, tmp: Path) -> dict[str, Any]:
        """Streamed, in resumable shards, reusing cached vectors by passage text."""
        def texts() -> Iterator[list[str]]:
            return ([p.contents for p in chunk]
                    for chunk in iter_passage_chunks(self.corpus_path, CORPUS_CHUNK))

        report = embed_corpus(texts, EmbeddingCache(self.embedding_cache, self.config),
                              self.config, tmp / "embeddings.npy", progress=self.progress,
                              engine=self.engine)
        self.encoder = report.encoder
        return report.manifest()

    def _faiss(self, tmp: Path) -> dict[str, Any]:
        emb = np.load(self.out_dir / "embeddings" / "embeddings.npy", mmap_mode="r")
        params = faiss_params(self.config, emb.shape[0], emb.shape[1])
        faiss.write_index(build_faiss(emb, params), str(tmp / "index.faiss"))
        return {"params": params.to_dict()}

    def index_manifest(self, name: str, wanted: Sequence[str]) -> dict[str, Any]:
        """The corpus's manifest.json: every component's fingerprint and whether reused."""
        manifests = self.manifests
        top = {"format": FORMAT_VERSION, "name": name, "complete": True,
               "fingerprint": _key_fingerprint({c: m["fingerprint"]
                                                for c, m in manifests.items()}),
               "corpus_fingerprint": self.corpus_fp, "corpus_path": str(self.corpus_path),
               "passages": manifests["passages"]["passages"], "retrievers": list(wanted),
               "encoder": self.config.encoder if "dense" in wanted else None,
               "components": {c: {"fingerprint": m["fingerprint"], "reused": self.reused[c]}
                              for c, m in manifests.items()}}
        if "faiss" in manifests:
            top["faiss"] = manifests["faiss"]["params"]
        if "embeddings" in manifests:  # passage vectors reused (whole component, or cache)
            emb = manifests["embeddings"]
            built = not self.reused["embeddings"]
            top["embeddings"] = {
                "passages_reused": emb.get("passages_reused", 0) if built else emb["rows"],
                "passages_embedded": emb.get("passages_embedded", emb["rows"]) if built else 0,
                "cache_dir": emb.get("cache_dir")}
        return top


def build_index(corpus_path: Path, out_dir: Path, config: IndexConfig,
                eval_sets: dict[str, Path] | None, sink: MetricsSink, *,
                name: str = MAIN_CORPUS, progress: bool = True,
                embedding_cache: Path | None = None,
                engine: RayEngine | None = None) -> IndexBuildResult:
    """Index one corpus into `out_dir` (reusing components whose manifests match), scan it
    for poisoning, measure recall@k on `eval_sets` (name -> QA file with supporting_doc_ids),
    and log metrics (prefixed `name.`) and the scan report to `sink`.

    `out_dir/manifest.json` is written last; while it is absent the index is not complete.
    Passage vectors are cached by text under `embedding_cache` (default
    `out_dir/embedding_cache`) and reused by later builds.
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out_dir)
    (out_dir / DIR_MANIFEST).unlink(missing_ok=True)
    wanted = components_for(config)
    components = _Components(Path(corpus_path), out_dir, config, progress, embedding_cache,
                             engine)
    components.build(wanted)
    top = components.index_manifest(name, wanted)
    atomic_write_text(out_dir / DIR_MANIFEST, json.dumps(top, indent=2, sort_keys=True))
    result = IndexBuildResult(
        name=name, index_dir=out_dir, fingerprint=top["fingerprint"],
        passages=int(top["passages"]), components=components.reused,
        build_seconds=round(time.perf_counter() - start, 3),
        index_bytes=sum(m["bytes"] for m in components.manifests.values()),
        scan=json.loads((out_dir / "scan.json").read_text()))
    if eval_sets:
        # Reuse the encoder loaded for embedding, if any: loading it again costs seconds.
        searcher = load_corpus_searcher(out_dir, config, encoder=components.encoder)
        for eval_name, qa_path in eval_sets.items():
            recall = measure_recall(searcher, qa_path, config.eval_top_k)
            if recall:
                result.recall[eval_name] = recall
    sink.log_metrics(result.metrics())
    sink.log_artifact(out_dir / "scan.json", f"index/{name}")
    sink.log_artifact(out_dir / DIR_MANIFEST, f"index/{name}")
    return result


# --- evaluation


def measure_recall(searcher: LocalSearcher, qa_path: Path, ks: Sequence[int],
                   batch: int = 256) -> dict[str, dict[int, float]]:
    """Mean share of each question's supporting passages found in the top k, per retriever.

    Questions without `supporting_doc_ids` are skipped; {} when none has any.
    """
    examples = [ex for ex in read_qa(qa_path) if ex.supporting_doc_ids]
    if not examples:
        return {}
    max_k = max(ks)
    out: dict[str, dict[int, float]] = {}
    for retriever in searcher.available():
        sums = dict.fromkeys(ks, 0.0)
        for start in range(0, len(examples), batch):
            chunk = examples[start:start + batch]
            rankings = searcher.rank([ex.question for ex in chunk], max_k, retriever)
            for ex, ranking in zip(chunk, rankings, strict=True):
                ids = [searcher.passages[row].id for row, _ in ranking]
                gold = set(ex.supporting_doc_ids)
                for k in ks:
                    sums[k] += len(gold & set(ids[:k])) / len(gold)
        out[retriever] = {k: round(sums[k] / len(examples), 4) for k in ks}
    return out


# --- multi-corpus stage helpers


def build_indexes(corpora: Mapping[str, Path], eval_sets: Mapping[str, Mapping[str, Path]],
                  stage_dir: Path, config: IndexConfig, sink: MetricsSink,
                  progress: bool = True, engine: RayEngine | None = None
                  ) -> tuple[str, list[IndexBuildResult]]:
    """`build_index` for each corpus (name -> path) into `stage_dir/<name>`, then
    `stage_dir/manifest.json` (written last) and `stage_dir/report.json`. Corpora with the
    same content are indexed once, under the first name (prepare-data points every extra
    eval set at the corpus it wrote; at wiki scale each index takes hours): the manifest's
    `aliases` maps the other names to it, and its recall covers all their eval sets.

    Returns (combined fingerprint, per-corpus results, one per distinct corpus).
    """
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / DIR_MANIFEST).unlink(missing_ok=True)
    first: dict[str, str] = {}  # corpus content fingerprint -> the name it is indexed under
    aliases: dict[str, str] = {}
    for name, path in corpora.items():
        aliases[name] = first.setdefault(fingerprint(path), name)
    measured: dict[str, dict[str, Path]] = {}
    for name, built in aliases.items():
        measured.setdefault(built, {}).update(eval_sets.get(name, {}))
    results = [build_index(corpora[name], stage_dir / name, config, sets, sink, name=name,
                           progress=progress, embedding_cache=stage_dir / "embedding_cache",
                           engine=engine)
               for name, sets in measured.items()]
    combined = _key_fingerprint({r.name: r.fingerprint for r in results})
    report = {r.name: {"passages": r.passages, "fingerprint": r.fingerprint,
                       "reused": r.components, "build_seconds": r.build_seconds,
                       "index_bytes": r.index_bytes, "recall": r.recall,
                       "scan": {k: v for k, v in r.scan.items() if k != "findings"},
                       "scan_findings": r.scan.get("findings", [])[:20]}
              for r in results}
    atomic_write_text(stage_dir / "report.json", json.dumps(report, indent=2))
    atomic_write_text(stage_dir / DIR_MANIFEST, json.dumps(
        {"format": FORMAT_VERSION, "complete": True, "fingerprint": combined,
         "retriever": config.retriever, "corpora": {r.name: r.fingerprint for r in results},
         "aliases": {n: built for n, built in aliases.items() if n != built}},
        indent=2, sort_keys=True))
    return combined, results


# --- loading


def resolve_corpus(index_dir: Path, corpus: str) -> Path:
    """The directory holding `corpus`'s index: `index_dir` itself when that is one corpus
    directory, else the corpus's (or the one it aliases, see `build_indexes`) under it."""
    manifest = read_manifest(index_dir, directory=True)
    if manifest is not None and "corpus_fingerprint" in manifest:
        return index_dir  # already a corpus directory
    aliases: dict[str, str] = manifest.get("aliases", {}) if manifest is not None else {}
    return index_dir / aliases.get(corpus, corpus)


def load_corpus_searcher(corpus_dir: Path, config: IndexConfig,
                         encoder: Encoder | None = None) -> LocalSearcher:
    """A LocalSearcher over one complete corpus directory; IndexStoreError if incomplete or built
    with a different encoder than `config.encoder`."""
    manifest = read_manifest(corpus_dir, directory=True)
    if manifest is None or not manifest.get("complete"):
        raise IndexStoreError(f"{corpus_dir}: no complete index here (missing {DIR_MANIFEST}); "
                              "run the build_index stage (`python -m searchrl index`)")
    if manifest.get("format") != FORMAT_VERSION:  # another release's layout: never misread
        raise IndexStoreError(f"{corpus_dir}: index format {manifest.get('format')!r}, this "
                              f"release reads {FORMAT_VERSION}; rebuild it with this release "
                              "(`python -m searchrl index`)")
    built = set(manifest["retrievers"])
    needed = {"bm25", "dense"} if config.retriever == "hybrid" else {config.retriever}
    if not needed <= built:
        raise IndexStoreError(f"{corpus_dir}: index.retriever={config.retriever} needs "
                          f"{sorted(needed)} but only {sorted(built)} were built; rebuild with "
                          f"this config")
    passages = PassageStore(corpus_dir / "passages")
    bm25 = BM25Index.load(corpus_dir / "bm25", mmap=True) if "bm25" in built else None
    dense = None
    if "dense" in built:
        if manifest.get("encoder") != config.encoder:
            raise IndexStoreError(f"{corpus_dir}: built with encoder {manifest.get('encoder')!r} "
                              f"but index.encoder={config.encoder!r}; queries must be embedded "
                              "by the same model: rebuild or fix the config")
        index = prepare_for_search(faiss.read_index(str(corpus_dir / "faiss" / "index.faiss")),
                                   config)
        dense = DenseIndex(encoder or Encoder(config), index)
    return LocalSearcher(passages, config, bm25=bm25, dense=dense)


def load_searcher(index_dir: Path, config: IndexConfig, corpus: str = MAIN_CORPUS) -> Searcher:
    """The Searcher rollouts use: in-process over `index_dir` (the stage directory or one
    corpus directory), or an HTTP client of the retrieval service when
    `config.mode == "service"` (then `index_dir` is not read)."""
    if config.mode == "service":
        from searchrl.retrieval.client import RetrievalClient

        # A plain client: a managed server is started by its owner (retrieval/provider.py).
        return RetrievalClient.from_config(config)
    return load_corpus_searcher(resolve_corpus(Path(index_dir), corpus), config)

