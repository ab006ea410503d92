"""Corpus stages at scale: `validate` and `index` (BM25 only) through the CLI at 100k, 300k
and 1M passages, each under `/usr/bin/time -v` (wall time, peak RSS), this tree's code beside
an older one's, then the fitted growth and the projection to wiki-18 (21,015,324 passages).

Figures and commands: docs/results/corpus_scale.md.

    # the corpora (real Wikipedia text replicated, see `make_corpus`) and configs, in /tmp
    .venv/bin/python benchmarks/bench_corpus_scale.py make --sizes 100000 300000 1000000
    # one stage of one size with one tree's code (what the table's rows are)
    .venv/bin/python benchmarks/bench_corpus_scale.py run --size 1000000 --stage validate
        [--src /tmp/old/src --label old] [engine.local_workers=0 ...]
    # every size x stage x code, old and new interleaved, one job at a time; then the table
    .venv/bin/python benchmarks/bench_corpus_scale.py all --old-src /tmp/old/src
    .venv/bin/python benchmarks/bench_corpus_scale.py table

The previous implementation is any other checkout's `src/` (`git worktree add /tmp/old
<commit>`): `--src` puts it first on PYTHONPATH for the measured process, nothing else
changes (same corpus, same config, same interpreter and packages).

Data: the 6,119 real English Wikipedia paragraphs of data/wiki2_corpus6k (shared/), copied
until the size is reached; copy k of a passage gets id `<id>-c<k>` and ` (copy <k>)` after its
contents, so every passage is distinct and the vocabulary grows by one token per copy (a real
corpus grows it faster: see the projection's notes). QA: 2,000 train / 500 dev / 500 test
questions about the first copy's passages, answers from their titles (all answerable).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEXT = REPO.parent / "shared" / "data" / "wiki2_corpus6k" / "corpus.jsonl"
ROOT = Path(os.environ.get("CORPUS_SCALE_DIR", "/tmp/corpus_scale"))
WIKI18_PASSAGES = 21_015_324  # Search-R1's wiki-18 (FlashRAG wiki18_100w), ~13 GB JSONL
STAGES = ("validate", "index")
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
       "TOKENIZERS_PARALLELISM": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
       "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def size_dir(size: int) -> Path:
    return ROOT / f"p{size}"


def make_corpus(source: Path, size: int, out: Path) -> None:
    """`size` passages: the source's, then copy 1, 2, ... with per-copy id and suffix."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    written = 0
    with out.open("w", encoding="utf-8") as fh:
        copy = 0
        while written < size:
            for row in rows[: size - written]:
                if copy:
                    row = {**row, "id": f"{row['id']}-c{copy}",
                           "contents": f"{row['contents']} (copy {copy})"}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += min(len(rows), size - written)
            copy += 1


def make_qa(source: Path, out: Path) -> None:
    """train/dev/test QA rows: 'Which article is about <first words>?' -> its title."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    qa = []
    for row in rows[:3000]:
        words = re.sub(r"\s+", " ", row["contents"]).split(" ")[:12]
        qa.append({"id": f"q-{row['id']}", "question": f"Which article says: {' '.join(words)}?",
                   "golden_answers": [row["title"]], "hops": 1, "type": "bridge",
                   "supporting_doc_ids": [row["id"]]})
    for name, part in (("train", qa[:2000]), ("dev", qa[2000:2500]), ("test", qa[2500:])):
        (out / f"{name}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part), encoding="utf-8")


def make_config(size: int, label: str) -> Path:
    """The config one measured run uses: files source, BM25 only, in-process search."""
    d = size_dir(size)
    path = d / f"config-{label}.yaml"
    cfg = {
        "run": {"name": f"corpus-scale-{size}-{label}", "work_dir": str(d / f"run-{label}")},
        "data": {"source": "files", "train_path": str(d / "train.jsonl"),
                 "dev_path": str(d / "dev.jsonl"), "test_path": str(d / "test.jsonl"),
                 "corpus_path": str(d / "corpus.jsonl")},
        "validate": {"overrides_path": None, "contracts_dir": str(REPO / "data_contracts"),
                     "allowed_types": ["bridge"], "max_quarantine_fraction": 1.0},
        "index": {"retriever": "bm25", "eval_all_retrievers": False, "mode": "inprocess"},
    }
    path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    return path


def cmd_make(args: argparse.Namespace) -> None:
    for size in args.sizes:
        d = size_dir(size)
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "corpus.jsonl").is_file():
            make_corpus(args.text, size, d / "corpus.jsonl")
        make_qa(args.text, d)
        print(f"{d}: {size} passages, {(d / 'corpus.jsonl').stat().st_size / 1e6:.0f} MB")


_TIME_FIELDS = {"Elapsed (wall clock) time (h:mm:ss or m:ss)": "wall",
                "Maximum resident set size (kbytes)": "max_rss_kb",
                "User time (seconds)": "user_s", "System time (seconds)": "sys_s"}


def _parse_time(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key in _TIME_FIELDS:
            name = _TIME_FIELDS[key]
            if name == "wall":
                secs = 0.0
                for part in value.split(":"):
                    secs = secs * 60 + float(part)
                out["wall_s"] = secs
            else:
                out[name] = float(value)
    return out


def _peak_tree_rss(proc: subprocess.Popen[bytes]) -> int:
    """The largest sum of resident bytes over the process and its descendants (the stage
    and its worker processes; `time -v` reports the largest single process), sampled every
    0.1 s until it exits."""
    import psutil

    peak = 0
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        total = 0
        with contextlib.suppress(psutil.Error):
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
        peak = max(peak, total)
        time.sleep(0.1)
    return peak


def run_stage(size: int, stage: str, src: Path, label: str,
              overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """One CLI stage under /usr/bin/time -v (`overrides`: key.sub=value, e.g.
    engine.local_workers=0); its figures appended to results.jsonl."""
    config = make_config(size, label)
    if stage == "validate":  # a fresh stage: nothing to reuse
        subprocess.run(["rm", "-rf", str(size_dir(size) / f"run-{label}")], check=True)
    else:  # index from this code's own validation, every component built anew
        subprocess.run(["rm", "-rf", str(size_dir(size) / f"run-{label}" / "build_index")],
                       check=True)
    env = {**os.environ, **ENV, "PYTHONPATH": str(src)}
    log = size_dir(size) / f"{stage}-{label}.log"
    load = os.getloadavg()[0]
    started = time.time()
    with log.open("w") as fh:
        proc = subprocess.Popen(["/usr/bin/time", "-v", sys.executable, "-m", "searchrl", stage,
                                 "--config", str(config), *overrides], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, cwd=REPO)
        tree_rss = _peak_tree_rss(proc)
    figures = _parse_time(log.read_text(errors="replace"))
    figures["tree_rss_kb"] = tree_rss / 1024
    record = {"size": size, "stage": stage, "label": label, "src": str(src),
              "overrides": list(overrides),
              "rc": proc.returncode, "load_before": round(load, 2),
              "load_after": round(os.getloadavg()[0], 2), "started": started,
              "corpus_bytes": (size_dir(size) / "corpus.jsonl").stat().st_size, **figures}
    with (ROOT / "results.jsonl").open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
    return record


def cmd_run(args: argparse.Namespace) -> None:
    run_stage(args.size, args.stage, args.src, args.label, tuple(args.overrides))


def cmd_all(args: argparse.Namespace) -> None:
    """Every size x stage, new and old in turn (interleaved), `--repeat` rounds."""
    for _ in range(args.repeat):
        for size in args.sizes:
            for stage in STAGES:
                run_stage(size, stage, REPO / "src", "new")
                if args.old_src is not None:
                    run_stage(size, stage, args.old_src, "old")


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares power law y = a * x^k on log-log points: (a, k)."""
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    k = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
         / max(sum((x - mx) ** 2 for x in xs), 1e-12))
    return math.exp(my - k * mx), k


def fit_linear(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares y = c + s * x: (c, s)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    s = (sum((x - mx) * (y - my) for x, y in points)
         / max(sum((x - mx) ** 2 for x, _ in points), 1e-12))
    return my - s * mx, s


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def cmd_table(args: argparse.Namespace) -> None:
    """Median per (size, stage, label) from results.jsonl, growth fits, wiki-18 projection."""
    records = [json.loads(line) for line in (ROOT / "results.jsonl").read_text().splitlines()
               if line.strip()]
    records = [r for r in records if r["rc"] == 0 and "wall_s" in r]
    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["size"], r["stage"], r["label"]), []).append(r)
    rows = []
    for (size, stage, label), rs in sorted(groups.items()):
        rows.append({"size": size, "stage": stage, "label": label, "runs": len(rs),
                     "wall_s": _median([r["wall_s"] for r in rs]),
                     "rss_gb": _median([r["max_rss_kb"] for r in rs]) / 1e6,
                     "tree_gb": _median([r.get("tree_rss_kb", math.nan) for r in rs]) / 1e6,
                     "load": _median([r["load_before"] for r in rs]),
                     "mb": rs[0]["corpus_bytes"] / 1e6})
    print("| passages (JSONL) | stage | code | runs | wall s | peak RSS GB "
          "| with workers GB | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['size']:,} ({r['mb']:.0f} MB) | {r['stage']} | {r['label']} | {r['runs']} "
              f"| {r['wall_s']:.1f} | {r['rss_gb']:.2f} | {r['tree_gb']:.2f} | {r['load']:.1f} |")
    print()
    # Growth: the exponent of a power-law fit (below 1 where a fixed cost weighs at 100k);
    # the projection: the linear fit (fixed + per passage), what a streamed pass costs.
    print("| stage | code | time ~ n^k | time: s + s per 1M passages | RSS: GB + GB per 1M "
          "| wiki-18 time (projected) | wiki-18 RSS (projected) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    m21 = WIKI18_PASSAGES / 1e6
    for stage in STAGES:
        for label in sorted({r["label"] for r in rows}):
            pts = [r for r in rows if r["stage"] == stage and r["label"] == label]
            if len(pts) < 2:
                continue
            _, k = fit([(r["size"], r["wall_s"]) for r in pts])
            tc, ts = fit_linear([(r["size"] / 1e6, r["wall_s"]) for r in pts])
            c, s = fit_linear([(r["size"] / 1e6, r["rss_gb"]) for r in pts])
            print(f"| {stage} | {label} | k={k:.2f} | {tc:.0f} + {ts:.0f}/M | {c:.2f} + {s:.2f}/M "
                  f"| {(tc + ts * m21) / 60:.0f} min | {c + s * m21:.1f} GB |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_corpus_scale.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make")
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    p.set_defaults(fn=cmd_make)
    p = sub.add_parser("run")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--stage", choices=STAGES, required=True)
    p.add_argument("--src", type=Path, default=REPO / "src")
    p.add_argument("--label", default="new")
    p.add_argument("overrides", nargs="*", help="key.sub=value, e.g. engine.local_workers=2")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("all")
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    p.add_argument("--old-src", type=Path)
    p.add_argument("--repeat", type=int, default=1)
    p.set_defaults(fn=cmd_all)
    p = sub.add_parser("table")
    p.set_defaults(fn=cmd_table)
    args = parser.parse_args(argv)
    args.fn(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
