"""Passage embedding at corpus scale: resumable shards, every local device, reuse by content.

A corpus is embedded into an `EmbeddingCache`: vectors keyed by the sha256 of the passage
text, for one encoder identity (encoder files' hash, passage prefix, dtype). `embed_corpus`

1. hashes every passage (streamed) and looks the hashes up in the cache;
2. cuts the texts not found (each distinct text once, in corpus order) into shards of
   `index.encoder_shard_size` and embeds them, one shard per worker at a time, each shard
   written to the cache the moment it finishes;
3. assembles `embeddings.npy` (row i = passage i) from the cache, memory-mapped.

A killed build loses only the shards in flight: the next run finds the finished ones in the
cache and resumes at the next unfinished shard. A corpus where 1% of passages changed embeds
those 1%. The shards a build cuts do not depend on the worker count and a shard's batches
depend only on the shard (length-sorted within it, `Encoder.encode_passages`), so 1 or N
workers, or a resumed build, give the same vectors bit for bit. Vectors found in the cache
were computed in the batches of the build that first embedded them: on CPU a text's vector
moves by <= 1e-7 with its batch's other members (padding), never more.

Local devices: `index.encoder_workers` processes (torch.multiprocessing, spawn), one per GPU by
default, each loading the encoder once and writing its shards itself. Several nodes
(`engine.kind: ray`): the same shards on the Ray engine's workers (`searchrl.ray_engine`), each
loading the encoder once and writing to the cache directory every node sees; a shard is a
pure function of (cache identity, its texts), so the vectors are the local ones bit for bit
and a shard whose worker died runs again elsewhere (tests/faults/test_ray_engine.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tqdm import tqdm

from searchrl.config import IndexConfig
from searchrl.datasets.io import atomic_write_text, atomic_writer
from searchrl.ray_engine import RayEngine, WorkerState
from searchrl.retrieval.dense import Encoder, encoder_device, encoder_dtype, encoder_hash, prefixes

CACHE_FORMAT = 1
HASH_DTYPE = np.dtype("S32")  # raw sha256 digests; fixed width, sorted and searched by bytes
_HASHES, _VECTORS = ".hashes.npy", ".vectors.npy"
# Temp files of a killed writer older than this are removed when the cache is opened.
STALE_TEMP_S = 3600.0

HashArray = NDArray[np.bytes_]
TextChunks = Callable[[], Iterable[list[str]]]


def text_hashes(texts: Iterable[str]) -> HashArray:
    """sha256 of each text (UTF-8), as an S32 array."""
    return np.array([hashlib.sha256(t.encode()).digest() for t in texts], dtype=HASH_DTYPE)


# --- the cache


@dataclass
class _Table:
    """Every cached hash, sorted, with the shard file and row holding its vector."""

    keys: HashArray
    files: NDArray[np.int32]
    rows: NDArray[np.int64]
    paths: list[Path]

    def lookup(self, hashes: HashArray) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
        """(file, row) per hash; file -1 where the hash is not cached."""
        if not len(self.keys):
            return np.full(len(hashes), -1, np.int32), np.zeros(len(hashes), np.int64)
        pos = np.minimum(np.searchsorted(self.keys, hashes), len(self.keys) - 1)
        hit = self.keys[pos] == hashes
        return np.where(hit, self.files[pos], -1).astype(np.int32), self.rows[pos]


class EmbeddingCache:
    """Vectors by passage-text hash for one encoder identity, under `root/<identity>/`, as
    shard file pairs `<name>.vectors.npy` + `<name>.hashes.npy`. The hashes file is written
    last (atomically), so a shard is visible exactly when complete. Picklable: workers get it.
    """

    def __init__(self, root: Path, config: IndexConfig) -> None:
        self.identity = {"format": CACHE_FORMAT, "encoder": config.encoder,
                         "encoder_hash": encoder_hash(config.encoder),
                         "passage_prefix": prefixes(config)[1], "dtype": encoder_dtype(config)}
        digest = hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode())
        self.dir = Path(root) / digest.hexdigest()[:16]

    def open(self) -> None:
        """Create the directory (with `identity.json`, for people) and drop stale temps."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / "identity.json").is_file():
            atomic_write_text(self.dir / "identity.json",
                              json.dumps(self.identity, indent=2, sort_keys=True))
        now = time.time()
        for tmp in self.dir.glob(".*.tmp"):
            try:
                if now - tmp.stat().st_mtime > STALE_TEMP_S:
                    tmp.unlink()
            except FileNotFoundError:
                pass

    def shards(self) -> list[Path]:
        """Complete shards' hashes files, by name."""
        return sorted(self.dir.glob(f"*{_HASHES}"))

    def write_shard(self, hashes: HashArray, vectors: NDArray[np.float32]) -> Path:
        """Store one shard; its name is a digest of its hashes, so writing it twice is
        harmless. Returns the hashes file."""
        if len(hashes) != len(vectors):
            raise ValueError(f"shard of {len(hashes)} hashes but {len(vectors)} vectors")
        name = "shard-" + hashlib.sha256(hashes.tobytes()).hexdigest()[:24]
        for suffix, array in ((_VECTORS, np.ascontiguousarray(vectors, np.float32)),
                              (_HASHES, hashes)):
            with atomic_writer(self.dir / (name + suffix)) as fh:
                np.save(fh, array)
        return self.dir / (name + _HASHES)

    def table(self) -> _Table:
        keys, files, rows, paths = [], [], [], []
        for i, path in enumerate(self.shards()):
            shard = np.load(path)
            keys.append(shard)
            files.append(np.full(len(shard), i, np.int32))
            rows.append(np.arange(len(shard), dtype=np.int64))
            paths.append(path)
        if not keys:
            return _Table(np.zeros(0, HASH_DTYPE), np.zeros(0, np.int32),
                          np.zeros(0, np.int64), [])
        all_keys = np.concatenate(keys)
        order = np.argsort(all_keys, kind="stable")
        return _Table(all_keys[order], np.concatenate(files)[order],
                      np.concatenate(rows)[order], paths)


def _vectors_of(hashes_path: Path) -> Path:
    return hashes_path.with_name(hashes_path.name[:-len(_HASHES)] + _VECTORS)


# --- planning: which texts, in which shards


def rows_to_embed(hashes: HashArray, cached: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Corpus rows to embed: the first row of each distinct uncached hash, in corpus order.

    A killed build's finished shards are whole runs of this list, so what is left of it is
    the rest of the same list, cut into the same shards."""
    _, first = np.unique(hashes, return_index=True)
    return np.sort(first[~cached[first]]).astype(np.int64)


def plan_shards(chunks: Iterable[list[str]], rows: NDArray[np.int64], hashes: HashArray,
                shard_size: int) -> Iterator[tuple[HashArray, list[str]]]:
    """(hashes, texts) of consecutive runs of `shard_size` of `rows`, read from the corpus
    streamed in `chunks` (holding one shard's texts at a time)."""
    buffer: list[str] = []
    done = 0  # rows already handed out
    start = 0
    for chunk in chunks:
        lo, hi = np.searchsorted(rows, [start, start + len(chunk)])
        buffer.extend(chunk[int(r) - start] for r in rows[lo:hi])
        start += len(chunk)
        while len(buffer) >= shard_size:
            yield hashes[rows[done:done + shard_size]], buffer[:shard_size]
            buffer = buffer[shard_size:]
            done += shard_size
    if buffer:
        yield hashes[rows[done:]], buffer


# --- running shards: in process, or one process per device


def worker_devices(config: IndexConfig) -> list[str]:
    """One device per worker: `encoder_workers` (0: one per visible GPU, 1 on CPU), GPUs
    assigned round robin."""
    if encoder_device(config) == "cpu":
        return ["cpu"] * max(1, config.encoder_workers)
    import torch

    gpus = max(1, torch.cuda.device_count())
    return [f"cuda:{i % gpus}" for i in range(config.encoder_workers or gpus)]


def embed_shard(encoder: Encoder, cache: EmbeddingCache, hashes: HashArray,
                texts: list[str]) -> int:
    """Embed one shard (batches cut from it alone) and write it to the cache."""
    cache.write_shard(hashes, encoder.encode_passages(texts, progress=False))
    return len(texts)


_WORKER: dict[str, Any] = {}


def _init_worker(config: IndexConfig, cache: EmbeddingCache, devices: Any,
                 threads: int) -> None:
    try:
        import torch

        torch.set_num_threads(threads)
        _WORKER["encoder"] = Encoder(config, device=devices.get())
        _WORKER["cache"] = cache
    except Exception as exc:  # a failing initializer makes Pool respawn workers forever
        _WORKER["error"] = exc


def _worker_shard(hashes: HashArray, texts: list[str]) -> int:
    if "error" in _WORKER:
        raise _WORKER["error"]
    return embed_shard(_WORKER["encoder"], _WORKER["cache"], hashes, texts)


def run_shards(shards: Iterable[tuple[HashArray, list[str]]], config: IndexConfig,
               cache: EmbeddingCache, devices: list[str],
               bar: tqdm) -> Encoder | None:
    """Embed every shard into `cache`: in this process for one device (returns its encoder),
    else one spawned process per device, at most two shards queued per worker (a corpus is
    never held whole). If this process is killed, a worker finishes (and caches) the shard it
    is on, then exits on the broken result pipe; an idle one exits at once."""
    if len(devices) == 1:
        encoder = Encoder(config, device=devices[0])
        for hashes, texts in shards:
            bar.update(embed_shard(encoder, cache, hashes, texts))
        return encoder
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    for device in devices:
        queue.put(device)
    threads = max(1, (os.cpu_count() or 1) // len(devices))
    with ctx.Pool(len(devices), initializer=_init_worker,
                  initargs=(config, cache, queue, threads)) as pool:
        pending: deque[AsyncResult[int]] = deque()
        for hashes, texts in shards:
            if len(pending) >= 2 * len(devices):
                bar.update(pending.popleft().get())
            pending.append(pool.apply_async(_worker_shard, (hashes, texts)))
        while pending:
            bar.update(pending.popleft().get())
    return None


def _embed_on_worker(state: WorkerState,
                     item: tuple[IndexConfig, EmbeddingCache, HashArray, list[str]]) -> int:
    """One shard on an engine worker, with the encoder the worker loaded once."""
    config, cache, hashes, texts = item
    encoder = state.get("encoder", cache.dir,
                        lambda: Encoder(config, device=worker_devices(config)[0]))
    return embed_shard(encoder, cache, hashes, texts)


def run_shards_on(engine: RayEngine, shards: Iterable[tuple[HashArray, list[str]]],
                  config: IndexConfig, cache: EmbeddingCache, bar: tqdm) -> None:
    """`run_shards` on the engine's workers (streamed: a few shards per worker in flight)."""
    items = ((config, cache, hashes, texts) for hashes, texts in shards)
    for count in engine.map(_embed_on_worker, items):
        bar.update(count)


# --- the whole build


@dataclass
class EmbedReport:
    """What `embed_corpus` did; `manifest()` goes into the embeddings component's manifest."""

    rows: int
    dim: int
    passages_reused: int  # rows whose vector came from the cache
    passages_embedded: int  # rows whose text was embedded by this build
    texts_embedded: int  # distinct texts embedded (duplicates embed once)
    shards_embedded: int
    workers: int
    dtype: str
    cache_dir: str
    embed_seconds: float
    encoder: Encoder | None = field(default=None, repr=False)

    def manifest(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "encoder"}
        out["embed_seconds"] = round(self.embed_seconds, 3)
        return out


def embed_corpus(chunks: TextChunks, cache: EmbeddingCache, config: IndexConfig,
                 out_path: Path, progress: bool = True,
                 engine: RayEngine | None = None) -> EmbedReport:
    """Write `out_path` (.npy, row i = the i-th text of `chunks()`, normalised float32),
    embedding only texts the cache lacks, shard by shard (module docstring), on `engine`'s
    workers when given. `chunks` is called again for each pass over the corpus."""
    cache.open()
    hashes = np.concatenate([text_hashes(c) for c in chunks()] or [np.zeros(0, HASH_DTYPE)])
    if not len(hashes):
        raise ValueError("no passages to embed")
    files, _ = cache.table().lookup(hashes)
    todo = rows_to_embed(hashes, files >= 0)
    shard_size = config.encoder_shard_size
    n_shards = -(-len(todo) // shard_size)
    devices = worker_devices(config)[:max(1, n_shards)]
    start = time.perf_counter()
    encoder = None
    if n_shards:
        with tqdm(total=len(todo), desc="embedding", unit="passage",
                  disable=not progress) as bar:
            shards = plan_shards(chunks(), todo, hashes, shard_size)
            if engine is None:
                encoder = run_shards(shards, config, cache, devices, bar)
            else:
                run_shards_on(engine, shards, config, cache, bar)
                devices = engine.worker_nodes()
    embed_seconds = time.perf_counter() - start
    dim = assemble(cache, hashes, out_path)
    embedded = int(np.isin(hashes, hashes[todo]).sum()) if n_shards else 0
    return EmbedReport(rows=len(hashes), dim=dim, passages_reused=len(hashes) - embedded,
                       passages_embedded=embedded, texts_embedded=len(todo),
                       shards_embedded=n_shards, workers=len(devices) if n_shards else 0,
                       dtype=encoder_dtype(config), cache_dir=str(cache.dir),
                       embed_seconds=embed_seconds, encoder=encoder)


def assemble(cache: EmbeddingCache, hashes: HashArray, out_path: Path) -> int:
    """Write the vectors of `hashes` (all cached) to `out_path` shard file by shard file,
    through a memory map. Returns the dimension."""
    table = cache.table()
    files, rows = table.lookup(hashes)
    if (files < 0).any():
        first = int(np.flatnonzero(files < 0)[0])
        raise RuntimeError(f"{cache.dir}: no vector for passage row {first} after embedding "
                           "(a shard file was removed while building?); build again")
    dim = int(np.load(_vectors_of(table.paths[int(files[0])]), mmap_mode="r").shape[1])
    out = np.lib.format.open_memmap(out_path, mode="w+", dtype=np.float32,
                                    shape=(len(hashes), dim))
    order = np.argsort(files, kind="stable")
    bounds = np.flatnonzero(np.diff(files[order])) + 1
    for group in np.split(order, bounds):
        vectors = np.load(_vectors_of(table.paths[int(files[group[0]])]), mmap_mode="r")
        out[group] = vectors[rows[group]]
    out.flush()
    del out
    for used in np.unique(files):  # last use: retention drops the least recently used shards
        os.utime(table.paths[int(used)])
    return dim
