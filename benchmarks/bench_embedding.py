"""Dense index build at 20k-50k real passages (MiniLM on CPU): this tree's sharded, cached
embedding beside an older tree's one-process embedding, and the rebuild after a 1% change.

Figures, commands and the projection to wiki-18: docs/results/dense_scale.md.

    # corpora in /tmp (real Wikipedia text replicated, as bench_corpus_scale.py does)
    .venv/bin/python benchmarks/bench_embedding.py make --size 20000 --out /tmp/emb/c20k.jsonl
    # the same corpus with 1% of passages rewritten (evenly drawn, seeded)
    .venv/bin/python benchmarks/bench_embedding.py change --src /tmp/emb/c20k.jsonl \\
        --out /tmp/emb/c20k_1pct.jsonl --fraction 0.01
    # one dense build (passages + embeddings + Flat faiss) into OUT; prints a JSON line
    .venv/bin/python benchmarks/bench_embedding.py build --corpus /tmp/emb/c20k.jsonl \\
        --out /tmp/emb/idx [--workers N] [--shard-size N]

`build` runs `build_index` with retriever=dense, the bundled MiniLM, batch 64, on CPU; with an
older tree's code first on PYTHONPATH (`PYTHONPATH=/tmp/old_dense/src`) it measures that
code (then --workers/--shard-size must be left out: the old config has no such fields). Time
the whole process from outside (e.g. `/usr/bin/time -v`); the printed JSON adds the
component's own figures (embed_seconds, passages reused / embedded) where the code has them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEXT = REPO.parent / "shared" / "data" / "wiki2_corpus6k" / "corpus.jsonl"
for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_key, _value)


def make_corpus(source: Path, size: int, out: Path) -> None:
    """`size` passages: the source's, then copy 1, 2, ... with id `<id>-c<k>` and
    ` (copy <k>)` after the contents (every text distinct)."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for i in range(size):
            copy, row = divmod(i, len(rows))
            passage = dict(rows[row])
            if copy:
                passage["id"] = f"{passage['id']}-c{copy}"
                passage["contents"] = f"{passage['contents']} (copy {copy})"
            fh.write(json.dumps(passage, ensure_ascii=False) + "\n")


def change_corpus(source: Path, out: Path, fraction: float, seed: int = 0) -> int:
    """Rewrite `fraction` of the passages (rows drawn with `seed`): ` (revised)` appended.
    Returns how many changed."""
    import numpy as np

    lines = source.read_text(encoding="utf-8").splitlines()
    picked = set(np.random.default_rng(seed).choice(
        len(lines), size=round(len(lines) * fraction), replace=False).tolist())
    with out.open("w", encoding="utf-8") as fh:
        for i, line in enumerate(lines):
            row = json.loads(line)
            if i in picked:
                row["contents"] += " (revised)"
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(picked)


def build(corpus: Path, out: Path, workers: int | None, shard_size: int | None) -> dict:
    from searchrl.config import IndexConfig
    from searchrl.retrieval.index_store import build_index
    from searchrl.sinks import NullSink

    settings: dict = {"retriever": "dense", "eval_all_retrievers": False,
                      "encoder_device": "cpu", "encoder_batch_size": 64, "faiss_index": "Flat"}
    if workers is not None:
        settings["encoder_workers"] = workers
    if shard_size is not None:
        settings["encoder_shard_size"] = shard_size
    start = time.perf_counter()
    result = build_index(corpus, out, IndexConfig(**settings), None, NullSink(), progress=False)
    seconds = time.perf_counter() - start
    emb = json.loads((out / "embeddings" / "manifest.json").read_text())
    top = json.loads((out / "manifest.json").read_text())
    return {"passages": result.passages, "build_seconds": round(seconds, 2),
            "embeddings_build_seconds": emb["build_seconds"],
            "embed_seconds": emb.get("embed_seconds"), "reused": result.components,
            "embedding_reuse": top.get("embeddings"),
            "code": str(Path(sys.modules["searchrl"].__file__ or "").parent)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make")
    make.add_argument("--size", type=int, required=True)
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("--source", type=Path, default=DEFAULT_TEXT)
    change = sub.add_parser("change")
    change.add_argument("--src", type=Path, required=True)
    change.add_argument("--out", type=Path, required=True)
    change.add_argument("--fraction", type=float, default=0.01)
    run = sub.add_parser("build")
    run.add_argument("--corpus", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--workers", type=int)
    run.add_argument("--shard-size", type=int)
    args = parser.parse_args()
    if args.command == "make":
        make_corpus(args.source, args.size, args.out)
    elif args.command == "change":
        print(change_corpus(args.src, args.out, args.fraction), "passages changed")
    else:
        print(json.dumps(build(args.corpus, args.out, args.workers, args.shard_size)))


if __name__ == "__main__":
    main()
