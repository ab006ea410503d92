"""Retrieval performance on real text, side by side in one run.

Figures: docs/results/retrieval_performance.md.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_retrieval_real.py
        [--corpus data/wiki2_corpus6k/corpus.jsonl] [--out runs/bench_real]
        [--only bm25 faiss embed quality] [--extras DIR]

Data (both real English Wikipedia text, shipped in data/):
- corpus: the 6,119 wiki2 paragraphs minus 408 held out (every 15th row from row 7) + the
  994 HotpotQA passages = 6,705 real passages.
- queries: the 100 HotpotQA questions + the first sentence (<= 30 words) of each of the 408
  held-out wiki2 paragraphs (wiki2 ships no questions) = 508 real queries.
- larger corpora (25k, 100k) are the real one replicated with perturbations, said so in every
  table: copy r of a passage gives its capitalised non-stopword words (names) a copy-specific
  suffix, so names stay rare as in a real larger corpus, and swaps 10% of its other words for
  words drawn from the corpus' own word frequencies, so common words' posting lists grow
  with the corpus. Sizes up to 6,705 are real passages only.

Sections (`--only`):
- bm25: bm25s vs rank-bm25 (same tokens, same k1/b; query tokenisation included on both
  sides) one query at a time and batched, at each corpus size; and the project's wrapper
  (`BM25Index.search`, `LocalSearcher.search_batch`) against raw bm25s, the wrapper as it was
  before (retrieve(n_threads=1) per call), 2 threads, and bm25s' numba backend if importable.
- faiss: HNSW efSearch x M sweep against exact Flat (recall@10 vs Flat's top 10), one query
  at a time and batched, one thread, on MiniLM embeddings of the 6,705 real passages and on
  100k vectors (the real ones + interpolations of random pairs of them + noise).
- embed: passages/s embedding the 994 HotpotQA passages (torch on 2 threads as the stage):
  corpus-order chunks of 64 (before), `Encoder.encode_passages` (length-sorted batches), one
  `encode` call, and ONNX Runtime fp32 / dynamic int8 if importable, each with its recall@5.
- quality: recall@1/3/5/10 of BM25, dense, hybrid on the HotpotQA sample through
  `build_index` (as the stage measures it), and a sweep of the fusion weights and rrf_k.

Timings: each compared case runs in every round, interleaved, and the median round counts;
q/s are wall-clock on a shared machine (read the ratios), and single-thread comparisons also
give the ratio of process CPU time, which other processes' load disturbs less.
`--extras DIR` appends DIR to sys.path for optional packages kept out of the project
(numba, onnxruntime: `pip install --target DIR --no-deps onnxruntime onnx numba llvmlite
coloredlogs humanfriendly flatbuffers ml_dtypes`). Embeddings are cached under --out.
Results: <out>/bench_retrieval_real.json and <out>/tables.md (+ the HNSW plot).
"""

from __future__ import annotations

import os
import sys

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "--extras" in sys.argv:  # before bm25s is imported: it looks for numba at import time
    sys.path.append(sys.argv[sys.argv.index("--extras") + 1])

import argparse  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import string  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import bm25s  # noqa: E402
import faiss  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from searchrl.config import IndexConfig  # noqa: E402
from searchrl.retrieval.bm25 import BM25Index  # noqa: E402
from searchrl.retrieval.dense import Encoder  # noqa: E402
from searchrl.retrieval.hybrid import rrf_fuse  # noqa: E402
from searchrl.retrieval.index_store import LocalSearcher, build_index, measure_recall  # noqa: E402
from searchrl.sinks import NullSink  # noqa: E402
from searchrl.types import Passage  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOTPOT = ROOT / "data" / "hotpotqa_train100"
STOPWORDS = set(bm25s.stopwords.STOPWORDS_EN)
K1, B = IndexConfig().bm25_k1, IndexConfig().bm25_b
Timing = tuple[float, float]  # (wall s, process CPU s)


def clock(fn: Callable[[], Any]) -> tuple[Any, Timing]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, (time.perf_counter() - wall, time.process_time() - cpu)


def interleaved(cases: dict[str, Callable[[], Any]], rounds: int
                ) -> tuple[dict[str, Timing], dict[str, Any]]:
    """Median (wall, cpu) per case over `rounds`, cases alternating within each round."""
    times: dict[str, list[Timing]] = {name: [] for name in cases}
    outs: dict[str, Any] = {}
    for _ in range(rounds):
        for name, fn in cases.items():
            outs[name], t = clock(fn)
            times[name].append(t)
    return ({name: (statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts))
             for name, ts in times.items()}, outs)


def line(label: str, value: str) -> None:
    print(f"  {label:<58} {value}", flush=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(row) for row in fh if row.strip()]


# --- data


def first_sentence(text: str, max_words: int = 30) -> str:
    cut = text.find(". ")
    sentence = text if cut < 0 else text[:cut + 1]
    return " ".join(sentence.split()[:max_words])


def real_data(corpus: Path) -> tuple[list[str], list[str], int]:
    """(passages, queries, number of HotpotQA questions at the head of `queries`)."""
    wiki = read_jsonl(corpus)
    held = [row for i, row in enumerate(wiki) if i % 15 == 7]
    kept = [row for i, row in enumerate(wiki) if i % 15 != 7]
    texts = [r["contents"] for r in kept] + [r["contents"] for r in
                                              read_jsonl(HOTPOT / "corpus.jsonl")]
    questions = [r["question"] for r in read_jsonl(HOTPOT / "questions.jsonl")]
    return texts, questions + [first_sentence(r["contents"]) for r in held], len(questions)


def suffix(copy_no: int) -> str:
    letters, n = "", copy_no
    while n:
        n, rem = divmod(n - 1, 26)
        letters = string.ascii_lowercase[rem] + letters
    return "x" + letters


def scaled_corpus(real: list[str], n: int, seed: int = 0) -> list[str]:
    """`n` passages: a random real subset when n <= len(real), else the real passages plus
    perturbed replicas (see the module docstring)."""
    rng = np.random.default_rng(seed)
    if n <= len(real):
        return [real[i] for i in sorted(rng.permutation(len(real))[:n])]
    words = [w for t in real for w in t.split()]
    out = list(real)
    copy_no = 0
    while len(out) < n:
        copy_no += 1
        tag = suffix(copy_no)
        for i in rng.permutation(len(real)):
            if len(out) >= n:
                break
            toks = real[i].split()
            swaps = rng.random(len(toks)) < 0.10
            picks = rng.integers(0, len(words), len(toks))
            new = []
            for tok, swap, pick in zip(toks, swaps, picks, strict=True):
                bare = tok.strip(string.punctuation)
                if bare[:1].isupper() and bare.lower() not in STOPWORDS:
                    new.append(tok.replace(bare, bare + tag, 1))
                elif swap:
                    new.append(words[pick])
                else:
                    new.append(tok)
            out.append(" ".join(new))
    return out


# --- 1: BM25


def rank_bm25_top10(okapi: Any, query: str) -> list[int]:
    qtok = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
    scores = okapi.get_scores(qtok)
    top = np.argpartition(-scores, 10)[:10]
    return [int(i) for i in top[np.argsort(-scores[top])]]


def old_wrapper_search(index: BM25Index, queries: Sequence[str], k: int) -> list[Any]:
    """`BM25Index.search` as it was before this benchmark: bm25s.retrieve(n_threads=1)."""
    ids = index.tokenizer.tokenize(list(queries), return_as="ids", update_vocab=False,
                                   show_progress=False)
    docs, scores = index.retriever.retrieve(ids, k=k, show_progress=False, n_threads=1)
    return [[(int(d), float(s)) for d, s in zip(rd, rs, strict=True) if s > 0]
            for rd, rs in zip(np.asarray(docs), np.asarray(scores), strict=True)]


def n_rank_queries(size: int) -> int:
    # rank-bm25 scans every document per query term in Python: keep its share to seconds.
    return int(min(200, max(30, 2_000_000 // size)))


def bench_bm25(real: list[str], queries: list[str], sizes: list[int], rounds: int,
               results: dict[str, Any]) -> None:
    from rank_bm25 import BM25Okapi

    rows = []
    numba_ok = bm25s.NUMBA_AVAILABLE
    for size in sizes:
        texts = scaled_corpus(real, size)
        kind = "real" if size <= len(real) else "real+perturbed replicas"
        print(f"\n[bm25] {size} passages ({kind}), {len(queries)} queries", flush=True)
        index, (build_s, _) = clock(lambda t=texts: BM25Index.build(t, k1=K1, b=B))
        raw_tokens, (rtok_s, _) = clock(lambda t=texts: bm25s.tokenize(
            t, stopwords="en", show_progress=False))
        raw = bm25s.BM25(k1=K1, b=B, method="lucene")
        _, (rbuild_s, _) = clock(lambda r=raw, t=raw_tokens: r.index(t, show_progress=False))
        str_tokens, (stok_s, _) = clock(lambda t=texts: bm25s.tokenize(
            t, stopwords="en", return_ids=False, show_progress=False))
        okapi, (obuild_s, _) = clock(lambda t=str_tokens: BM25Okapi(t, k1=K1, b=B))
        line("build: wrapper / raw bm25s / rank-bm25 (+ tokenising)",
             f"{build_s:.1f} / {rbuild_s + rtok_s:.1f} / {obuild_s + stok_s:.1f} s")
        searcher = LocalSearcher([Passage(id=str(i), contents=t) for i, t in enumerate(texts)],
                                 IndexConfig(retriever="bm25", eval_all_retrievers=False),
                                 bm25=index)
        nb = None
        if numba_ok:
            nb = copy.copy(raw)
            nb.backend = "numba"
            nb.activate_numba_scorer()
            _, (jit_s, _) = clock(lambda b=nb: b.retrieve(bm25s.tokenize(
                queries[:4], stopwords="en", show_progress=False), k=10, show_progress=False))
            line("numba backend: first call (JIT compile)", f"{jit_s:.1f} s")

        def raw_batch(qs: Sequence[str], backend: Any = raw) -> Any:
            return backend.retrieve(bm25s.tokenize(list(qs), stopwords="en",
                                                   show_progress=False),
                                    k=10, show_progress=False)

        sub = queries[:n_rank_queries(size)]
        one, outs1 = interleaved({
            "rank_bm25": lambda s=sub, o=okapi: [rank_bm25_top10(o, q) for q in s],
            "raw": lambda s=sub: [raw_batch([q]) for q in s],
            "wrapper_before": lambda s=sub, ix=index: [old_wrapper_search(ix, [q], 10)
                                                       for q in s],
            "wrapper": lambda s=sub, ix=index: [ix.search([q], 10) for q in s],
        }, rounds)
        cases: dict[str, Callable[[], Any]] = {
            "raw": lambda: raw_batch(queries),
            "wrapper_before": lambda ix=index: old_wrapper_search(ix, queries, 10),
            "wrapper": lambda ix=index: ix.search(queries, 10),
            "wrapper_2threads": lambda ix=index: ix.search(queries, 10, n_threads=2),
            "search_batch": lambda s=searcher: s.search_batch(queries, 10),
        }
        if nb is not None:
            cases["raw_numba"] = lambda b=nb: raw_batch(queries, b)
        batch, outs = interleaved(cases, rounds)
        assert outs["wrapper"] == outs["wrapper_before"] == outs["wrapper_2threads"], \
            "the wrapper's rankings changed"
        overlap = float(np.mean([
            len({r for r, _ in mine[0]} & set(theirs)) / 10
            for mine, theirs in zip(outs1["wrapper"], outs1["rank_bm25"], strict=True)
            if mine[0]]))
        n1, nb_ = len(sub), len(queries)
        row: dict[str, Any] = {
            "passages": size, "kind": kind, "n_one_at_a_time": n1, "n_batch": nb_,
            "build_s": {"wrapper": build_s, "raw": rbuild_s + rtok_s,
                        "rank_bm25": obuild_s + stok_s},
            "one_qps": {k: n1 / w for k, (w, _) in one.items()},
            "one_cpu_qps": {k: n1 / c for k, (_, c) in one.items()},
            "batch_qps": {k: nb_ / w for k, (w, _) in batch.items()},
            "batch_cpu_qps": {k: nb_ / c for k, (_, c) in batch.items()},
            "top10_overlap_with_rank_bm25": overlap,
        }
        if nb is not None:
            agree = np.mean([len(set(np.asarray(a)) & {r for r, _ in b}) / max(1, len(b))
                             for a, b in zip(outs["raw_numba"][0], outs["wrapper"],
                                             strict=True) if b])
            row["numba_top10_agreement"] = float(agree)
        rows.append(row)
        o, bq = row["one_qps"], row["batch_qps"]
        line("one at a time q/s: rank-bm25 / raw bm25s / wrapper before / now",
             f"{o['rank_bm25']:.0f} / {o['raw']:.0f} / {o['wrapper_before']:.0f} / "
             f"{o['wrapper']:.0f}")
        line("bm25s / rank-bm25, one at a time (wall; CPU)",
             f"{o['raw'] / o['rank_bm25']:.1f}x; "
             f"{row['one_cpu_qps']['raw'] / row['one_cpu_qps']['rank_bm25']:.1f}x")
        line("bm25s batched / rank-bm25 one at a time",
             f"{bq['raw'] / o['rank_bm25']:.1f}x")
        line("batch q/s: raw / before / wrapper / 2 threads / search_batch"
             + (" / numba" if nb is not None else ""),
             " / ".join(f"{bq[k]:.0f}" for k in cases))
        line("top-10 overlap with rank-bm25 (Lucene vs Okapi idf)", f"{overlap:.2f}")
    results["bm25"] = rows


# --- 2: faiss HNSW sweep


def cached(path: Path, make: Callable[[], np.ndarray]) -> tuple[np.ndarray, float | None]:
    """(array, seconds it took) from `path`, making and saving it on the first run."""
    if path.exists():
        meta = path.with_suffix(".json")
        seconds = json.loads(meta.read_text())["seconds"] if meta.exists() else None
        return np.load(path), seconds
    arr, (seconds, _) = clock(make)
    np.save(path, arr)
    path.with_suffix(".json").write_text(json.dumps({"seconds": seconds, "rows": len(arr)}))
    return arr, seconds


def text_key(texts: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:10]


def extend(emb: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    k = n - len(emb)
    a, b = rng.integers(0, len(emb), k), rng.integers(0, len(emb), k)
    w = rng.uniform(0.2, 0.8, (k, 1)).astype(np.float32)
    extra = w * emb[a] + (1 - w) * emb[b] + rng.normal(0, 0.02, (k, emb.shape[1])).astype(
        np.float32)
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    return np.ascontiguousarray(np.concatenate([emb, extra]), dtype=np.float32)


def recall10(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact,
                                                                      strict=True)]))


def sweep_faiss(emb: np.ndarray, qemb: np.ndarray, ms: list[int], efs: list[int],
                ef_construction: int, rounds: int) -> dict[str, Any]:
    flat = faiss.IndexFlatIP(emb.shape[1])
    flat.add(emb)
    faiss.omp_set_num_threads(1)
    _, exact = flat.search(qemb, 10)
    singles = [qemb[i:i + 1] for i in range(len(qemb))]
    built: dict[int, tuple[Any, float]] = {}
    for m in ms:
        faiss.omp_set_num_threads(2)  # building is not what is compared; use both cores
        index = faiss.IndexHNSWFlat(emb.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        _, (build_s, _) = clock(lambda ix=index: ix.add(emb))
        built[m] = (index, build_s)
    faiss.omp_set_num_threads(1)
    cases: dict[str, Callable[[], Any]] = {
        "Flat/one": lambda: [flat.search(q, 10) for q in singles],
        "Flat/batch": lambda: flat.search(qemb, 10)}
    settings: dict[str, tuple[int, int]] = {}
    for m in ms:
        for ef in efs:
            settings[f"M{m}/ef{ef}"] = (m, ef)

            def one(ix: Any = built[m][0], ef: int = ef) -> Any:
                ix.hnsw.efSearch = ef
                return [ix.search(q, 10) for q in singles]

            def batch(ix: Any = built[m][0], ef: int = ef) -> Any:
                ix.hnsw.efSearch = ef
                return ix.search(qemb, 10)

            cases[f"M{m}/ef{ef}/one"] = one
            cases[f"M{m}/ef{ef}/batch"] = batch
    times, outs = interleaved(cases, rounds)
    n = len(qemb)
    flat_one, flat_batch = n / times["Flat/one"][0], n / times["Flat/batch"][0]
    rows = []
    for name, (m, ef) in settings.items():
        rec = recall10(outs[f"{name}/batch"][1], exact)
        one_qps, batch_qps = n / times[f"{name}/one"][0], n / times[f"{name}/batch"][0]
        rows.append({"M": m, "efSearch": ef, "recall10": rec, "one_qps": one_qps,
                     "batch_qps": batch_qps, "one_vs_flat": one_qps / flat_one,
                     "batch_vs_flat": batch_qps / flat_batch, "build_s": built[m][1]})
    ok = [r for r in rows if r["recall10"] >= 0.95]
    return {"vectors": len(emb), "flat_one_qps": flat_one, "flat_batch_qps": flat_batch,
            "ef_construction": ef_construction, "rows": rows,
            "best_one_at_095": max(ok, key=lambda r: r["one_qps"]) if ok else None,
            "best_batch_at_095": max(ok, key=lambda r: r["batch_qps"]) if ok else None}


def print_sweep(sweep: dict[str, Any]) -> None:
    line(f"Flat, {sweep['vectors']} vectors: one / batch q/s",
         f"{sweep['flat_one_qps']:.0f} / {sweep['flat_batch_qps']:.0f}")
    for r in sweep["rows"]:
        line(f"HNSW M={r['M']:<2} efSearch={r['efSearch']:<3} (build {r['build_s']:.1f} s)",
             f"recall@10 {r['recall10']:.3f}  one {r['one_qps']:6.0f} q/s "
             f"({r['one_vs_flat']:4.1f}x Flat)  batch {r['batch_qps']:6.0f} q/s "
             f"({r['batch_vs_flat']:4.1f}x)")
    for key in ("best_one_at_095", "best_batch_at_095"):
        best = sweep[key]
        line(f"{key}", "none" if best is None else
             f"M={best['M']} efSearch={best['efSearch']} recall {best['recall10']:.3f}")


def embed_real(real: list[str], queries: list[str], out: Path
               ) -> tuple[np.ndarray, np.ndarray, float | None]:
    torch.set_num_threads(2)
    encoder = Encoder(IndexConfig(encoder_device="cpu"))
    emb, emb_s = cached(out / f"minilm_passages_{len(real)}_{text_key(real)}.npy",
                        lambda: encoder.encode_passages(real, progress=True))
    qemb, _ = cached(out / f"minilm_queries_{len(queries)}_{text_key(queries)}.npy",
                     lambda: encoder.encode_queries(queries))
    torch.set_num_threads(1)
    return emb, qemb, emb_s


def bench_faiss(real: list[str], queries: list[str], out: Path, args: argparse.Namespace,
                results: dict[str, Any]) -> None:
    print(f"\n[faiss] MiniLM embeddings of {len(real)} real passages, {len(queries)} queries",
          flush=True)
    emb, qemb, emb_s = embed_real(real, queries, out)
    if emb_s:
        line("embedding (encode_passages, 2 threads, first run)",
             f"{len(real) / emb_s:.1f} passages/s")
    sweeps = []
    for n in args.faiss_vectors:
        vectors = emb if n <= len(emb) else extend(emb, n)
        kind = "real" if n <= len(emb) else f"{len(emb)} real + interpolated"
        print(f"  -- {len(vectors)} vectors ({kind})", flush=True)
        sweep = sweep_faiss(vectors, qemb, args.hnsw_m, args.ef_search, args.ef_construction,
                            args.rounds)
        sweep["kind"] = kind
        print_sweep(sweep)
        sweeps.append(sweep)
    results["faiss"] = {"embed_passages_per_s": len(real) / emb_s if emb_s else None,
                        "sweeps": sweeps}
    plot_sweeps(sweeps, out / "hnsw_curve.png")


def plot_sweeps(sweeps: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    from searchrl.plots import save_figure

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    for ax, mode in zip(fig.subplots(1, 2), ("one", "batch"), strict=True):
        for sweep in sweeps:
            for m in sorted({r["M"] for r in sweep["rows"]}):
                pts = [r for r in sweep["rows"] if r["M"] == m]
                ax.plot([r["recall10"] for r in pts], [r[f"{mode}_qps"] for r in pts],
                        marker="o", label=f"{sweep['vectors']} vec, M={m}")
            ax.axhline(sweep[f"flat_{mode}_qps"], linestyle="--", linewidth=0.8,
                       color="grey")
        ax.axvline(0.95, color="red", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("recall@10 vs exact (Flat)")
        ax.set_ylabel("queries/s, 1 thread")
        how = "one query at a time" if mode == "one" else "batched"
        ax.set_title(f"HNSW efSearch 16-256, {how} (dashed: Flat)", fontsize=10)
        ax.legend(fontsize=7)
    save_figure(fig, path)


# --- 3: embedding throughput and backends


class OrtEncoder:
    """MiniLM through ONNX Runtime: same tokenizer, mean pooling and normalisation as the
    sentence-transformers pipeline (Transformer -> Pooling(mean) -> Normalize)."""

    def __init__(self, path: Path, tokenizer: Any, max_len: int, batch: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.names = {i.name for i in self.session.get_inputs()}
        self.tokenizer, self.max_len, self.batch = tokenizer, max_len, batch

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), 384), dtype=np.float32)
        for start in range(0, len(texts), self.batch):
            rows = order[start:start + self.batch]
            enc = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                 max_length=self.max_len, return_tensors="np")
            feeds = {k: v.astype(np.int64) for k, v in enc.items() if k in self.names}
            hidden = self.session.run(None, feeds)[0]
            mask = enc["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)
            out[rows] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out


def export_onnx(model: Any, out: Path) -> tuple[Path, Path]:
    """fp32 ONNX export of the MiniLM transformer (torch.onnx) and its dynamic int8 copy."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32, int8 = out / "minilm.onnx", out / "minilm_int8.onnx"
    if not fp32.exists():
        bert = model[0].auto_model.eval()

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bert = bert

            def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        token_type_ids: torch.Tensor) -> torch.Tensor:
                return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids).last_hidden_state

        enc = model.tokenizer(["a short one", "and a somewhat longer second sentence"],
                              padding=True, return_tensors="pt")
        axes = {"b": 0, "s": 1}
        tmp = fp32.with_suffix(".tmp")
        torch.onnx.export(Wrapped(), (enc["input_ids"], enc["attention_mask"],
                                      enc["token_type_ids"]), str(tmp),
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"],
                          dynamic_axes={n: {v: k for k, v in axes.items()} for n in (
                              "input_ids", "attention_mask", "token_type_ids",
                              "last_hidden_state")},
                          opset_version=17, dynamo=False)
        tmp.rename(fp32)
    if not int8.exists():
        quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    return fp32, int8


def recall_at(emb: np.ndarray, qemb: np.ndarray, ids: list[str], gold: list[set[str]],
              ks: Sequence[int] = (1, 3, 5, 10)) -> dict[int, float]:
    order = np.argsort(-(qemb @ emb.T), axis=1, kind="stable")[:, :max(ks)]
    return {k: float(np.mean([len(g & {ids[r] for r in row[:k]}) / len(g)
                              for row, g in zip(order, gold, strict=True)])) for k in ks}


def bench_embed(out: Path, rounds: int, results: dict[str, Any]) -> None:
    torch.set_num_threads(2)
    passages = read_jsonl(HOTPOT / "corpus.jsonl")
    qa = read_jsonl(HOTPOT / "questions.jsonl")
    texts, ids = [p["contents"] for p in passages], [p["id"] for p in passages]
    questions, gold = [q["question"] for q in qa], [set(q["supporting_doc_ids"]) for q in qa]
    print(f"\n[embed] {len(texts)} HotpotQA passages, torch threads 2", flush=True)
    encoder = Encoder(IndexConfig(encoder_device="cpu"))
    model, bs = encoder.model, encoder.batch_size

    def corpus_order() -> np.ndarray:  # the stage before: chunks of 64 in corpus order
        return np.concatenate([encoder._encode(texts[i:i + bs])
                               for i in range(0, len(texts), bs)])

    cases: dict[str, Callable[[], Any]] = {
        "corpus-order chunks of 64 (before)": corpus_order,
        "encode_passages (length-sorted, now)": lambda: encoder.encode_passages(
            texts, progress=False),
        "one encode call": lambda: np.asarray(model.encode(
            texts, batch_size=bs, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False)),
    }
    queries: dict[str, Callable[[], np.ndarray]] = {
        name: (lambda: encoder.encode_queries(questions)) for name in cases}
    try:
        fp32, int8 = export_onnx(model, out)
        max_len = int(model.max_seq_length)
        for label, path in (("ONNX Runtime fp32", fp32), ("ONNX Runtime int8 (dynamic)", int8)):
            ort_enc = OrtEncoder(path, model.tokenizer, max_len, bs)
            cases[label] = lambda e=ort_enc: e.encode(texts)
            queries[label] = lambda e=ort_enc: e.encode(questions)
    except ImportError as exc:
        line("ONNX Runtime", f"skipped: {exc}")
    times, outs = interleaved(cases, rounds)
    reference = outs["one encode call"]
    rows = []
    for name, (wall, cpu) in times.items():
        emb = outs[name]
        cos = float(np.mean(np.sum(emb * reference, axis=1)))
        rec = recall_at(emb, queries[name](), ids, gold)
        rows.append({"case": name, "passages_per_s": len(texts) / wall,
                     "cpu_passages_per_s": len(texts) / cpu, "mean_cos_to_torch": cos,
                     "recall": rec})
        line(name, f"{len(texts) / wall:6.1f} passages/s  cos {cos:.4f}  "
             f"recall@5 {rec[5]:.3f}")
    torch.set_num_threads(1)
    results["embed"] = {"passages": len(texts), "rounds": rounds, "rows": rows}


# --- 4: retrieval quality on the HotpotQA sample


def bench_quality(out: Path, results: dict[str, Any]) -> None:
    print("\n[quality] recall@k on the HotpotQA sample (100 questions, 994 passages)",
          flush=True)
    torch.set_num_threads(2)
    config = IndexConfig(retriever="hybrid", encoder_device="cpu")
    built = build_index(HOTPOT / "corpus.jsonl", out / "hotpotqa_index", config,
                        {"hotpotqa": HOTPOT / "questions.jsonl"}, NullSink(),
                        name="hotpotqa", progress=False)
    recall = built.recall["hotpotqa"]
    for retriever, by_k in recall.items():
        line(f"{retriever:<7} recall@1/3/5/10", " / ".join(f"{by_k[k]:.3f}" for k in
                                                           sorted(by_k)))
    from searchrl.retrieval.index_store import load_corpus_searcher

    searcher = load_corpus_searcher(out / "hotpotqa_index", config)
    qa = read_jsonl(HOTPOT / "questions.jsonl")
    questions, gold = [q["question"] for q in qa], [set(q["supporting_doc_ids"]) for q in qa]
    depth = 50
    ranked = {"bm25": searcher.rank(questions, depth, "bm25"),
              "dense": searcher.rank(questions, depth, "dense")}

    def rec(rankings: list[Any], k: int) -> float:
        return float(np.mean([len(g & {searcher.passages[r].id for r, _ in ranking[:k]})
                              / len(g) for ranking, g in zip(rankings, gold, strict=True)]))

    sweep = []
    for w_dense in (0.5, 1.0, 1.5, 2.0, 3.0):
        for rrf_k in (5, 10, 20, 30, 60, 100):
            fused = rrf_fuse(ranked, {"bm25": 1.0, "dense": w_dense}, top_k=10, k=rrf_k)
            sweep.append({"w_bm25": 1.0, "w_dense": w_dense, "rrf_k": rrf_k,
                          "recall": {k: rec(fused, k) for k in (1, 3, 5, 10)}})
    best = max(sweep, key=lambda s: (s["recall"][5], s["recall"][10], s["recall"][1]))
    line("fusion sweep: best recall@5", f"{best['recall'][5]:.3f} (w_dense={best['w_dense']}, "
         f"rrf_k={best['rrf_k']})")
    default = next(s for s in sweep if s["w_dense"] == 1.0 and s["rrf_k"] == 60)
    line("fusion default (1:1, k=60) recall@5", f"{default['recall'][5]:.3f}")
    recall_measured = measure_recall(searcher, HOTPOT / "questions.jsonl", (1, 3, 5, 10))
    assert recall_measured == recall
    results["quality"] = {"recall": recall, "fusion_sweep": sweep, "best": best}


def table_md(results: dict[str, Any]) -> str:
    """The result tables as Markdown (copied into docs/results/retrieval_performance.md)."""
    out: list[str] = []
    if "bm25" in results:
        out += ["### BM25: bm25s vs rank-bm25 by corpus size", "",
                "| passages | corpus | build s (bm25s / rank-bm25) | rank-bm25 q/s (1 at a time)"
                " | bm25s q/s (1 at a time) | ratio wall | ratio CPU | bm25s batched q/s |"
                " batched / rank-bm25 | top-10 overlap |", "|" + "---|" * 10]
        for r in results["bm25"]:
            o, oc, bq = r["one_qps"], r["one_cpu_qps"], r["batch_qps"]
            out.append(f"| {r['passages']:,} | {r['kind']} | {r['build_s']['raw']:.1f} / "
                       f"{r['build_s']['rank_bm25']:.1f} | {o['rank_bm25']:.1f} | "
                       f"{o['raw']:.0f} | {o['raw'] / o['rank_bm25']:.1f}x | "
                       f"{oc['raw'] / oc['rank_bm25']:.1f}x | {bq['raw']:.0f} | "
                       f"{bq['raw'] / o['rank_bm25']:.1f}x | "
                       f"{r['top10_overlap_with_rank_bm25']:.2f} |")
        out += ["", "### BM25: the project's search path vs raw bm25s (q/s, wall; CPU in "
                "brackets)", ""]
        keys = [k for k in results["bm25"][0]["batch_qps"]]
        out += ["| passages | mode | " + " | ".join(keys) + " |", "|" + "---|" * (2 + len(keys))]
        for r in results["bm25"]:
            one = " | ".join(f"{r['one_qps'][k]:.0f} ({r['one_cpu_qps'][k]:.0f})"
                             if k in r["one_qps"] else "" for k in keys)
            bat = " | ".join(f"{r['batch_qps'][k]:.0f} ({r['batch_cpu_qps'][k]:.0f})"
                             for k in keys)
            out.append(f"| {r['passages']:,} | one at a time | {one} |")
            out.append(f"| {r['passages']:,} | batch of {r['n_batch']} | {bat} |")
    if "faiss" in results:
        for sweep in results["faiss"]["sweeps"]:
            out += ["", f"### HNSW sweep, {sweep['vectors']:,} vectors ({sweep['kind']}), "
                    f"efConstruction {sweep['ef_construction']}, 1 thread", "",
                    f"Flat (exact): {sweep['flat_one_qps']:.0f} q/s one at a time, "
                    f"{sweep['flat_batch_qps']:.0f} q/s batched.", "",
                    "| M | efSearch | recall@10 | one q/s | x Flat | batched q/s | x Flat |"
                    " build s |", "|" + "---|" * 8]
            for r in sweep["rows"]:
                out.append(f"| {r['M']} | {r['efSearch']} | {r['recall10']:.3f} | "
                           f"{r['one_qps']:.0f} | {r['one_vs_flat']:.1f} | "
                           f"{r['batch_qps']:.0f} | {r['batch_vs_flat']:.1f} | "
                           f"{r['build_s']:.1f} |")
    if "embed" in results:
        e = results["embed"]
        out += ["", f"### Embedding {e['passages']} HotpotQA passages (MiniLM, 2 threads)", "",
                "| how | passages/s (wall) | x before | passages per CPU-s | x before |"
                " mean cos to torch | recall@1 | recall@5 | recall@10 |", "|" + "---|" * 9]
        base, base_cpu = e["rows"][0]["passages_per_s"], e["rows"][0]["cpu_passages_per_s"]
        for r in e["rows"]:
            rec = {int(k): v for k, v in r["recall"].items()}
            out.append(f"| {r['case']} | {r['passages_per_s']:.1f} | "
                       f"{r['passages_per_s'] / base:.2f} | {r['cpu_passages_per_s']:.1f} | "
                       f"{r['cpu_passages_per_s'] / base_cpu:.2f} | "
                       f"{r['mean_cos_to_torch']:.4f} | "
                       f"{rec[1]:.3f} | {rec[5]:.3f} | {rec[10]:.3f} |")
    if "quality" in results:
        q = results["quality"]
        out += ["", "### Recall@k on the HotpotQA sample (100 questions, 994 passages)", "",
                "| retriever | @1 | @3 | @5 | @10 |", "|---|---|---|---|---|"]
        for name, by_k in q["recall"].items():
            by = {int(k): v for k, v in by_k.items()}
            out.append(f"| {name} | " + " | ".join(f"{by[k]:.3f}" for k in (1, 3, 5, 10))
                       + " |")
        out += ["", "Fusion sweep (recall@5 / @10), bm25 weight 1:", "",
                "| w_dense \\ rrf_k | " + " | ".join(
                    str(k) for k in sorted({s["rrf_k"] for s in q["fusion_sweep"]})) + " |",
                "|" + "---|" * (1 + len({s["rrf_k"] for s in q["fusion_sweep"]}))]
        for w in sorted({s["w_dense"] for s in q["fusion_sweep"]}):
            cells = [f"{s['recall']['5']:.3f} / {s['recall']['10']:.3f}" for s in
                     sorted((s for s in q["fusion_sweep"] if s["w_dense"] == w),
                            key=lambda s: s["rrf_k"])]
            out.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--corpus", type=Path,
                        default=ROOT / "data" / "wiki2_corpus6k" / "corpus.jsonl")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_real")
    parser.add_argument("--only", nargs="*", default=["bm25", "faiss", "embed", "quality"],
                        choices=["bm25", "faiss", "embed", "quality"])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1000, 3000, 0, 25_000, 100_000],
                        help="BM25 corpus sizes; 0 = every real passage")
    parser.add_argument("--faiss-vectors", type=lambda s: [int(x) for x in s.split(",")],
                        default=[0, 100_000], help="0 = the real embeddings only")
    parser.add_argument("--hnsw-m", type=lambda s: [int(x) for x in s.split(",")],
                        default=[16, 32, 48])
    parser.add_argument("--ef-search", type=lambda s: [int(x) for x in s.split(",")],
                        default=[16, 32, 64, 128, 256])
    parser.add_argument("--ef-construction", type=int, default=IndexConfig().hnsw_ef_construction)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--embed-rounds", type=int, default=1)
    parser.add_argument("--extras", type=Path, default=None,
                        help="extra site dir for optional numba / onnxruntime (appended)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    real, queries, n_hotpot = real_data(args.corpus)
    args.sizes = [s or len(real) for s in args.sizes]
    print(f"real corpus: {len(real)} passages; queries: {len(queries)} ({n_hotpot} HotpotQA "
          f"questions + {len(queries) - n_hotpot} held-out wiki2 first sentences); "
          f"numba {'yes' if bm25s.NUMBA_AVAILABLE else 'no'}", flush=True)
    path = args.out / "bench_retrieval_real.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    results |= {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg(),
                "real_passages": len(real), "queries": len(queries)}
    if "bm25" in args.only:
        bench_bm25(real, queries, args.sizes, args.rounds, results)
    if "faiss" in args.only:
        args.faiss_vectors = [n or len(real) for n in args.faiss_vectors]
        bench_faiss(real, queries, args.out, args, results)
    if "embed" in args.only:
        bench_embed(args.out, args.embed_rounds, results)
    if "quality" in args.only:
        bench_quality(args.out, results)
    results["load_avg_at_end"] = os.getloadavg()
    path.write_text(json.dumps(results, indent=2, default=float))
    (args.out / "tables.md").write_text(table_md(json.loads(path.read_text())))
    print(f"\nwritten {path} and {args.out / 'tables.md'}")


if __name__ == "__main__":
    main()
