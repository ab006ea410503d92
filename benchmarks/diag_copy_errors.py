"""How well a finished run's policies copy names out of their context (issue 25, item 1).

Every search query and answer of the tiny world is a name the policy must copy: from the
question (the first query) or from an `<information>` block (later queries, the answer). For
each evaluated system of a run, per question type: the share of search queries that are an
exact copy of a span already in the context, and of answers. Then, for every wrong answer
whose gold answer *was* in an inserted block (a copy that failed), the first sub-word piece
the policy got wrong and how often the piece before it occurs in the context: 1 means a
one-token induction head (match the current piece, copy what followed it) had exactly one
place to copy from, so the error is not an ambiguity of that kind.

    .venv/bin/python benchmarks/diag_copy_errors.py runs/tiny [--systems sft trained]
        [--examples 12]

Reads `<run>/validate_gold_labels/test.jsonl`, `<run>/evaluate_policy/trajectories_<system>.jsonl`
and the cold start's tokenizer (`<run>/train_policy/sft`); seconds, no model.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from searchrl.datasets.io import read_qa
from searchrl.rl.prompts import ANSWER_OPEN, build_prompt

# Trajectory texts keep the inserted blocks verbatim (INFO_OPEN / INFO_CLOSE, newlines aside).
_INFO = re.compile(r"<information>(.*?)</information>", re.S)


def _trajectories(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a pipeline work dir (run.work_dir)")
    parser.add_argument("--systems", nargs="+", default=["sft", "trained"])
    parser.add_argument("--examples", type=int, default=8,
                        help="failed copies to print per system")
    args = parser.parse_args()
    questions = {q.id: q for q in read_qa(args.run / "validate_gold_labels" / "test.jsonl")}
    tokenizer = AutoTokenizer.from_pretrained(str(args.run / "train_policy" / "sft"))

    for system in args.systems:
        trajectories = _trajectories(
            args.run / "evaluate_policy" / f"trajectories_{system}.jsonl")
        # type -> [exact queries, queries, answers in context, answers]
        rates: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        predecessor_counts: Counter[str] = Counter()
        shown: list[str] = []
        for traj in trajectories:
            question = questions[traj["example_id"]]
            kind = question.type or "?"
            infos = _INFO.findall(traj["text"])
            for turn, query in enumerate(traj["queries"]):
                rates[kind][1] += 1
                rates[kind][0] += query.strip() in question.question + " ".join(infos[:turn])
            answer = (traj.get("answer") or "").strip()
            if not answer:
                continue
            rates[kind][3] += 1
            rates[kind][2] += answer in question.question + " ".join(infos)
            gold = question.golden_answers[0]
            if traj["correct"] or gold not in " ".join(infos):
                continue
            # What the policy had read when it began its answer (not the answer itself).
            read = traj["text"].rsplit(ANSWER_OPEN, 1)[0] + ANSWER_OPEN
            context = tokenizer.tokenize(build_prompt(question.question) + read)
            # The answer as the policy wrote it: after ANSWER_OPEN with the demos' leading space.
            want, got = tokenizer.tokenize(" " + gold), tokenizer.tokenize(" " + answer)
            first_wrong = next((i for i, piece in enumerate(want)
                                if i >= len(got) or got[i] != piece), len(want))
            if first_wrong == 0:
                predecessor_counts["first piece wrong"] += 1
                continue
            before = want[first_wrong - 1]
            # The gold name occurs in the context; count the predecessor's occurrences there.
            n = context.count(before)
            label = {0: "0 (tokenised otherwise)", 1: "1 (unambiguous)"}.get(n, "2+")
            predecessor_counts[label] += 1
            if len(shown) < args.examples:
                shown.append(f"  {kind:28s} {' '.join(want)}  ->  {' '.join(got)}   "
                             f"(wrong after {before!r}, in context {n}x)")

        print(f"\n{system}: exact copies per question type")
        print("| type | queries exact | answers in context |")
        print("|---|---|---|")
        for kind, (qe, qn, ae, an) in sorted(rates.items()):
            print(f"| {kind} | {qe}/{qn} ({qe / max(qn, 1):.2f}) "
                  f"| {ae}/{an} ({ae / max(an, 1):.2f}) |")
        total = sum(predecessor_counts.values())
        print(f"{system}: {total} wrong answers whose gold was shown; piece before the first "
              f"wrong one occurs in the context: " + ", ".join(
                  f"{k} {v}" for k, v in sorted(predecessor_counts.items())))
        print("\n".join(shown))


if __name__ == "__main__":
    main()
