"""Dense embedding in resumable shards (retrieval/embedding.py) with the bundled MiniLM on CPU:
a kill -9 mid-way resumes to the same vectors, 2 workers give 1 worker's vectors, a 1% corpus
change embeds 1%, an encoder change embeds everything; faiss trained on a sample and filled
in chunks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

from searchrl.config import IndexConfig, inputs_of
from searchrl.datasets.io import write_jsonl
from searchrl.retrieval import dense
from searchrl.retrieval.dense import build_faiss, faiss_params, resolve_encoder_path, training_rows
from searchrl.retrieval.embedding import (
    EmbeddingCache,
    embed_corpus,
    plan_shards,
    rows_to_embed,
    text_hashes,
)
from searchrl.retrieval.index_store import build_index, load_corpus_searcher
from searchrl.sinks import NullSink

WORDS = ("river", "city", "king", "queen", "war", "music", "bread", "mountain", "ship",
         "science", "painter", "novel", "church", "island", "battle", "school", "bridge",
         "engine", "garden", "language")
# Shards of 24, batches of 8: batch composition matters (texts of 4-30 words, padded).
CONFIG = IndexConfig(retriever="dense", eval_all_retrievers=False, encoder_device="cpu",
                     encoder_batch_size=8, encoder_shard_size=24)


N = 120
# build_index(corpus, out, config as JSON) in a process of its own, to kill
BUILD_SCRIPT = ("import sys; from pathlib import Path; from searchrl.config import IndexConfig; "
                "from searchrl.retrieval.index_store import build_index; "
                "from searchrl.sinks import NullSink; "
                "build_index(Path(sys.argv[1]), Path(sys.argv[2]), "
                "IndexConfig.model_validate_json(sys.argv[3]), None, NullSink(), "
                "progress=False)")
Reference = tuple[list[dict[str, str]], np.ndarray, Path]


def make_corpus(n: int, seed: int = 0) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    return [{"id": f"p{i}", "contents": f"Passage {i}: " + " ".join(
        rng.choice(WORDS, size=int(rng.integers(4, 30))))} for i in range(n)]


def embeddings(index_dir: Path) -> np.ndarray:
    return np.asarray(np.load(index_dir / "embeddings" / "embeddings.npy"))


def texts_of(rows: list[dict[str, str]]) -> Callable[[], list[list[str]]]:
    return lambda: [[r["contents"] for r in rows]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """120 passages (5 shards) embedded from an empty cache by one in-process worker."""
    root = tmp_path_factory.mktemp("ref")
    rows = make_corpus(N)
    report = embed_corpus(texts_of(rows), EmbeddingCache(root / "cache", CONFIG), CONFIG,
                          root / "emb.npy", progress=False)
    assert (report.passages_embedded, report.shards_embedded, report.workers) == (N, 5, 1)
    return rows, np.load(root / "emb.npy"), root / "cache"


# --- planning (no model)


def test_a_resumed_plan_cuts_the_unfinished_shards_of_the_first_plan() -> None:
    texts = [f"text {i % 45}" for i in range(50)]  # rows 45-49 repeat rows 0-4
    hashes = text_hashes(texts)
    rows = rows_to_embed(hashes, np.zeros(len(hashes), bool))
    assert rows.tolist() == list(range(45))  # each distinct text once, first row
    chunks = [texts[:7], texts[7:30], texts[30:]]
    first = [h for h, _ in plan_shards(chunks, rows, hashes, 10)]
    assert [len(h) for h in first] == [10, 10, 10, 10, 5]
    # shards 0 and 2 finished before a kill: what is left is shards 1, 3 and 4, as cut before
    cached = np.isin(hashes, np.concatenate([first[0], first[2]]))
    again = list(plan_shards(chunks, rows_to_embed(hashes, cached), hashes, 10))
    assert [h.tolist() for h, _ in again] == [first[i].tolist() for i in (1, 3, 4)]
    assert again[0][1] == texts[10:20]


def test_worker_count_changes_no_key_shard_size_and_dtype_do() -> None:
    base = inputs_of(IndexConfig(), "index.dense")
    assert inputs_of(IndexConfig(encoder_workers=8), "index.dense") == base
    assert inputs_of(IndexConfig(encoder_shard_size=100), "index.dense") != base
    assert inputs_of(IndexConfig(encoder_dtype="float16"), "index.dense") != base
    assert inputs_of(IndexConfig(encoder_dtype="float16"), "build_index") != inputs_of(
        IndexConfig(), "build_index")


# --- embedding


def _build_until_a_shard(rows: list[dict[str, str]], corpus: Path, out: Path,
                         config: IndexConfig, timeout_s: float) -> subprocess.Popen[bytes]:
    """`rows` written to `corpus` and build_index(corpus, out) started in a process of its
    own (BUILD_SCRIPT), returned running once its first shard is on disk (to be killed)."""
    write_jsonl(corpus, rows)
    proc = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(corpus), str(out),
                             config.model_dump_json()], stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    while not list(out.glob("embedding_cache/*/*.hashes.npy")):
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, f"no shard written in {timeout_s:g} s"
        time.sleep(0.02)
    return proc


def test_kill_9_mid_embedding_then_rerun_resumes_to_identical_vectors(
        reference: Reference, tmp_path: Path) -> None:
    rows, expected, _ = reference
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "idx"
    proc = _build_until_a_shard(rows, corpus, out, CONFIG, timeout_s=120)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    finished = len(list(out.glob("embedding_cache/*/*.hashes.npy")))
    assert 1 <= finished < 5 and not (out / "manifest.json").exists()

    result = build_index(corpus, out, CONFIG, None, NullSink(), progress=False)
    assert result.components["embeddings"] is False
    manifest = json.loads((out / "manifest.json").read_text())["embeddings"]
    # the shards finished before the kill (plus any written while it was dying) are reused
    assert manifest["passages_reused"] >= 24 * finished
    assert manifest["passages_reused"] + manifest["passages_embedded"] == N
    assert manifest["passages_embedded"] > 0
    np.testing.assert_array_equal(embeddings(out), expected)


def _spawned_workers(parent: int) -> list[int]:
    """Pids of `parent`'s multiprocessing children (their command line says spawn_main)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_kill_9_of_a_two_worker_build_leaves_no_worker_and_resumes(
        reference: Reference, tmp_path: Path) -> None:
    rows, expected, _ = reference
    config = CONFIG.model_copy(update={"encoder_workers": 2})
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "idx"
    proc = _build_until_a_shard(rows, corpus, out, config, timeout_s=180)
    workers = _spawned_workers(proc.pid)
    assert len(workers) >= 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60  # a busy worker ends its shard first (seconds here)
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if _alive(pid)], "workers outlived the killed build"
    build_index(corpus, out, config, None, NullSink(), progress=False)
    assert json.loads((out / "manifest.json").read_text())["embeddings"]["passages_reused"] > 0
    np.testing.assert_array_equal(embeddings(out), expected)


@pytest.mark.slow  # ~11 s (two worker processes): CI's slow step
def test_two_workers_give_the_vectors_of_one(
        reference: Reference, tmp_path: Path) -> None:
    rows, expected, _ = reference
    config = CONFIG.model_copy(update={"encoder_workers": 2})
    report = embed_corpus(texts_of(rows), EmbeddingCache(tmp_path, config), config,
                          tmp_path / "emb.npy", progress=False)
    assert (report.workers, report.shards_embedded, report.encoder) == (2, 5, None)
    np.testing.assert_array_equal(np.load(tmp_path / "emb.npy"), expected)


def test_one_percent_change_embeds_only_the_changed_passages(
        reference: Reference, tmp_path: Path) -> None:
    rows, expected, cache = reference
    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, rows)
    shutil.copytree(cache, tmp_path / "idx" / "embedding_cache")  # the reference's vectors
    first = build_index(corpus, tmp_path / "idx", CONFIG, None, NullSink(), progress=False)
    np.testing.assert_array_equal(embeddings(tmp_path / "idx"), expected)
    top = json.loads((tmp_path / "idx" / "manifest.json").read_text())["embeddings"]
    assert (top["passages_embedded"], top["passages_reused"]) == (0, N)
    # passages 10 and 100 rewritten (2 of 120), passage 30 a copy of passage 31 (cached text)
    changed = [dict(r) for r in rows]
    changed[10]["contents"] = "The violin is a wooden string instrument played with a bow."
    changed[100]["contents"] += " Revised."
    changed[30]["contents"] = rows[31]["contents"]
    write_jsonl(corpus, changed)
    second = build_index(corpus, tmp_path / "idx", CONFIG, None, NullSink(), progress=False)
    assert first.components["embeddings"] is second.components["embeddings"] is False
    top = json.loads((tmp_path / "idx" / "manifest.json").read_text())["embeddings"]
    assert (top["passages_embedded"], top["passages_reused"]) == (2, N - 2)
    now = embeddings(tmp_path / "idx")
    same = [i for i in range(N) if i not in (10, 30, 100)]
    np.testing.assert_array_equal(now[same], expected[same])
    np.testing.assert_array_equal(now[30], expected[31])
    searcher = load_corpus_searcher(tmp_path / "idx", CONFIG)
    assert searcher.dense is not None
    alone = searcher.dense.encoder.encode_passages([changed[10]["contents"]], progress=False)
    np.testing.assert_allclose(now[10], alone[0], atol=1e-6)
    hits = searcher.search_batch(["a bowed string instrument made of wood"], 1)
    assert hits[0][0].doc_id == "p10"


def test_an_encoder_change_embeds_everything_again(
        reference: Reference, tmp_path: Path) -> None:
    rows, expected, _ = reference
    bundled = resolve_encoder_path(CONFIG.encoder)
    assert bundled is not None
    other = tmp_path / "encoder"  # the same weights plus one file: another encoder hash
    for path in bundled.rglob("*"):
        if path.is_file():
            (other / path.relative_to(bundled)).parent.mkdir(parents=True, exist_ok=True)
            (other / path.relative_to(bundled)).symlink_to(path)
    (other / "NOTE.txt").write_text("a local copy")
    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, rows[:48])
    build_index(corpus, tmp_path / "idx", CONFIG, None, NullSink(), progress=False)
    copy = CONFIG.model_copy(update={"encoder": str(other)})
    result = build_index(corpus, tmp_path / "idx", copy, None, NullSink(), progress=False)
    assert result.components["embeddings"] is False
    top = json.loads((tmp_path / "idx" / "manifest.json").read_text())["embeddings"]
    assert (top["passages_embedded"], top["passages_reused"]) == (48, 0)
    assert len(list((tmp_path / "idx" / "embedding_cache").iterdir())) == 2
    np.testing.assert_array_equal(embeddings(tmp_path / "idx"), expected[:48])


def test_float16_vectors_are_normalised_float32_near_float32(
        reference: Reference) -> None:
    rows, expected, _ = reference
    encoder = dense.Encoder(CONFIG.model_copy(update={"encoder_dtype": "float16"}))
    half = encoder.encode_passages([r["contents"] for r in rows[:16]], progress=False)
    assert half.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(half, axis=1), 1.0, atol=1e-6)
    cosines = np.sum(half * expected[:16], axis=1)
    assert cosines.min() > 0.999 and not np.array_equal(half, expected[:16])


# --- faiss from a memory-mapped file


@pytest.mark.parametrize("kind", ["Flat", "IVF"])
def test_faiss_trains_on_a_sample_and_fills_in_chunks(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((3000, 32)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    np.save(tmp_path / "emb.npy", emb)
    mapped = np.load(tmp_path / "emb.npy", mmap_mode="r")
    config = IndexConfig(faiss_index=kind, ivf_nlist=4)
    params = faiss_params(config, len(emb), 32)
    assert len(training_rows(params, len(emb))) == (1024 if kind == "IVF" else 0)
    monkeypatch.setattr(dense, "FAISS_ADD_CHUNK", 700)  # 5 adds, the last one short
    index = build_faiss(mapped, params)
    assert index.ntotal == 3000
    if kind == "IVF":
        index.nprobe = 4  # every list: exact
    _, rows = index.search(emb[:50], 1)
    assert rows[:, 0].tolist() == list(range(50))
