"""Benchmark gold-label validation on synthetic rows: wall time per 10,000 QA rows.

    python -m searchrl.validation.bench --rows 10000 --passages 100000 --out /tmp/bench
    python -m searchrl.validation.bench --rows 100000 --bad-lines 1   # + a truncated train line

Writes a random corpus (word-salad passages, each QA answer planted in one of them, a few
answers planted nowhere) and QA files (train 80%, test 20%, a few leaked and near-duplicate
questions), runs the whole stage (`validate_gold_labels`: materialise, suites, checks, report)
and, on their own, the answerability scan and the gold_qa suite. Prints JSON seconds (wall
and, where the box is shared, this process's CPU seconds).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig
from searchrl.datasets.io import read_passages, read_raw_qa_rows_lenient, write_jsonl
from searchrl.text import normalize_answer
from searchrl.validation.answerability import find_answers
from searchrl.validation.suites import SuiteRunner
from searchrl.validation.validate import validate_gold_labels


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfgklmnprstvz") + rng.choice("aeiou")
                   for _ in range(rng.randint(2, 4)))


def make_data(out: Path, n_rows: int, n_passages: int, seed: int = 0) -> dict[str, Path]:
    """Write corpus.jsonl, train.jsonl, test.jsonl under `out`; return their paths."""
    rng = random.Random(seed)
    vocab = [_word(rng) for _ in range(50_000)]
    answers = [" ".join(rng.choices(vocab, k=rng.randint(1, 3))) for _ in range(n_rows)]
    passages: list[dict[str, Any]] = []
    for i in range(n_passages):
        passages.append({"id": f"p{i}", "title": _word(rng).capitalize(),
                         "contents": " ".join(rng.choices(vocab, k=60)) + "."})
    rows: list[dict[str, Any]] = []
    for i, answer in enumerate(answers):
        pid = rng.randrange(n_passages)
        if i % 200 != 0:  # 0.5% of answers are planted nowhere: unanswerable
            words = passages[pid]["contents"].split()
            words.insert(rng.randrange(len(words)), answer)
            passages[pid]["contents"] = " ".join(words)
        question = " ".join(rng.choices(vocab, k=rng.randint(8, 16))).capitalize() + "?"
        rows.append({"id": f"q{i}", "question": question, "golden_answers": [answer],
                     "hops": rng.randint(1, 3), "type": "bridge",
                     "supporting_doc_ids": [f"p{pid}"]})
    n_train = int(n_rows * 0.8)
    train, test = rows[:n_train], rows[n_train:]
    for k in range(min(20, len(test))):  # leak: exact copies and one-word edits into train
        q = test[k]["question"]
        train[k]["question"] = q if k % 2 else q.replace("?", f" {vocab[k]}?")
        train[k]["golden_answers"] = test[k]["golden_answers"]
        train[k]["supporting_doc_ids"] = test[k]["supporting_doc_ids"]
    paths = {name: out / f"{name}.jsonl" for name in ("corpus", "train", "test")}
    write_jsonl(paths["corpus"], passages)
    write_jsonl(paths["train"], train)
    write_jsonl(paths["test"], test)
    return paths


def truncate_lines(path: Path, n_bad: int) -> list[int]:
    """Cut `n_bad` evenly spaced lines of a JSONL file in half (a write cut short), in place;
    return their line numbers. The manifest no longer matches, as for a steward's edit."""
    lines = path.read_text(encoding="utf-8").splitlines()
    step = max(len(lines) // (n_bad + 1), 1)
    cut = [step * (k + 1) for k in range(n_bad) if step * (k + 1) <= len(lines)]
    for lineno in cut:
        lines[lineno - 1] = lines[lineno - 1][: len(lines[lineno - 1]) // 2]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return cut


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m searchrl.validation.bench")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_validate"))
    parser.add_argument("--contracts-dir", type=Path, default=Path("data_contracts"))
    parser.add_argument("--bad-lines", type=int, default=0,
                        help="truncate this many train lines (they must be quarantined)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    paths = make_data(args.out / "data", args.rows, args.passages)
    bad_lines = truncate_lines(paths["train"], args.bad_lines) if args.bad_lines else []
    t_data = time.perf_counter() - t0
    config = PipelineConfig.model_validate({
        "run": {"name": "bench", "work_dir": str(args.out / "run")},
        "data": {"source": "files", "train_path": str(paths["train"]),
                 "test_path": str(paths["test"]), "corpus_path": str(paths["corpus"])},
        "validate": {"overrides_path": None, "contracts_dir": str(args.contracts_dir),
                     "allowed_types": ["bridge"]},
    })
    t0, c0 = time.perf_counter(), time.process_time()
    result = validate_gold_labels(config, args.out / "validate")
    t_stage, c_stage = time.perf_counter() - t0, time.process_time() - c0

    passages = read_passages(paths["corpus"])
    t0 = time.perf_counter()
    rows = [raw for _, raw in read_raw_qa_rows_lenient(paths["train"])[0]]
    t_read = time.perf_counter() - t0
    answers = {normalize_answer(a) for r in rows for a in r["golden_answers"]}
    t0, c0 = time.perf_counter(), time.process_time()
    hits = find_answers(answers, [("corpus", passages)])
    t_scan, c_scan = time.perf_counter() - t0, time.process_time() - c0
    runner = SuiteRunner(args.contracts_dir, config.validate_)
    runner.run("gold_qa", "warmup", rows[:10])
    t0 = time.perf_counter()
    runner.run("gold_qa", "train", rows)
    t_suite = time.perf_counter() - t0
    print(json.dumps({
        "rows": args.rows, "passages": args.passages, "bad_lines": bad_lines,
        "generate_data_s": round(t_data, 2),
        "read_train_s": round(t_read, 3),
        "validate_stage_s": round(t_stage, 2),
        "validate_stage_s_per_10k_rows": round(t_stage * 10_000 / args.rows, 2),
        "validate_stage_cpu_s": round(c_stage, 2),
        "answer_scan_s": round(t_scan, 2), "answer_scan_cpu_s": round(c_scan, 2),
        "answers_found": len(hits),
        "answers_searched": len(answers),
        "gold_qa_suite_s_train_rows": round(t_suite, 2), "train_rows": len(rows),
        "counts": result.counts, "check_counts": result.check_counts,
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
