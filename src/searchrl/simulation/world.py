"""What changes in the world between two weekly runs: the gold rows and corpus on disk (a
synthetic world written as files, `data.source=files`), the steward's decisions, and the
faults a simulation injects. Every function changes files under one data directory:

    DIR/world/{train,dev,test,corpus}.jsonl   what the runs read (with their manifests)
    DIR/held_back_train.jsonl                  gold rows that arrive in later weeks
    DIR/overrides.yaml                         the stewards' decisions (apply-audit)
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.datasets.io import manifest_path, write_jsonl
from searchrl.text import normalize_answer

REVISION = " This entry was revised after week {week}."
SPLITS = ("train", "dev", "test")
STEWARD = "weekly-steward"


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def world_dir(data: Path) -> Path:
    return data / "world"


def world_overrides(data: Path) -> list[str]:
    """The overrides that point a run at the world's files, the stewards' overrides file and
    a tracking store in `data`."""
    world = world_dir(data)
    return ["data.source=files", *(f"data.{s}_path={world / f'{s}.jsonl'}"
                                   for s in (*SPLITS, "corpus")),
            f"validate.overrides_path={data / 'overrides.yaml'}",
            f"tracking.tracking_uri=sqlite:///{data / 'mlflow.db'}"]


def hold_back(data: Path, rows: int) -> dict[str, Any]:
    """Move the last `rows` train rows of the written world to DIR/held_back_train.jsonl: gold
    rows that arrive in later weeks; an empty overrides file."""
    world = world_dir(data)
    train = read_rows(world / "train.jsonl")
    rows = min(rows, len(train) - 2)
    write_jsonl(world / "train.jsonl", train[:len(train) - rows])
    write_jsonl(data / "held_back_train.jsonl", train[len(train) - rows:])
    (data / "overrides.yaml").write_text("[]\n")
    return {"dir": str(world), "train_rows_week1": len(train) - rows, "held_back": rows}


# --- a week's data change


@dataclass
class DataChange:
    rows_added: list[str] = field(default_factory=list)
    passages_added: list[str] = field(default_factory=list)
    passages_edited: list[str] = field(default_factory=list)
    passages_removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return dict(vars(self))


def release_rows(data: Path, count: int | None) -> list[str]:
    """Append `count` held-back train rows (None: all of them) to the world's train split."""
    pool_path = data / "held_back_train.jsonl"
    pool = read_rows(pool_path) if pool_path.is_file() else []
    n = len(pool) if count is None else min(count, len(pool))
    if n == 0:
        return []
    train_path = world_dir(data) / "train.jsonl"
    write_jsonl(train_path, read_rows(train_path) + pool[:n])
    write_jsonl(pool_path, pool[n:])
    return [r["id"] for r in pool[:n]]


def _cited(data: Path) -> set[str]:
    """Passages some gold row (held-back ones included) names as evidence."""
    world = world_dir(data)
    files = [world / f"{s}.jsonl" for s in SPLITS] + [data / "held_back_train.jsonl"]
    return {d for f in files if f.is_file() for r in read_rows(f)
            for d in r.get("supporting_doc_ids", [])}


def change_corpus(data: Path, week: int, *, edited: int, added: int, removed: int,
                  seed: int = 0) -> DataChange:
    """Edit, add and remove passages that no gold row cites (a cited passage removed would
    only quarantine its questions): an edit appends a sentence, an addition is a new passage
    about an existing title, a removal drops the passage."""
    rng = random.Random(f"{seed}:{week}")
    path = world_dir(data) / "corpus.jsonl"
    corpus = read_rows(path)
    free = [i for i, p in enumerate(corpus) if p["id"] not in _cited(data)]
    picked = rng.sample(free, min(len(free), edited + removed))
    change = DataChange()
    for i in picked[:edited]:
        corpus[i]["contents"] += REVISION.format(week=week)
        change.passages_edited.append(corpus[i]["id"])
    gone = {corpus[i]["id"] for i in picked[edited:]}
    change.passages_removed = sorted(gone)
    corpus = [p for p in corpus if p["id"] not in gone]
    for n in range(added):
        model = corpus[rng.randrange(len(corpus))]
        title = model["contents"].split("\n", 1)[0]
        new = {k: v for k, v in model.items() if k not in ("id", "contents")}
        new |= {"id": f"wk{week:03d}-{n}",
                "contents": f"{title}\nA note added in week {week}: records about {title} "
                            f"were reviewed and filed."}
        corpus.append(new)
        change.passages_added.append(new["id"])
    write_jsonl(path, corpus)
    return change


def two_weeks_change(data: Path, passages: int = 3) -> DataChange:
    """The two-week run's week-2 change (docs/results/two_weeks.md): every held-back row
    arrives, and the first `passages` passages no question cites get a sentence."""
    change = DataChange(rows_added=release_rows(data, None))
    path = world_dir(data) / "corpus.jsonl"
    corpus = read_rows(path)
    cited = _cited(data)
    for p in [p for p in corpus if p["id"] not in cited][:passages]:
        p["contents"] += REVISION.format(week=1)
        change.passages_edited.append(p["id"])
    write_jsonl(path, corpus)
    return change


# --- faults in the data


def corrupt_gold_file(data: Path) -> str:
    """A broken export: every line of the train split cut in half (its manifest kept, as a
    copy tool that truncates would). The original is kept for `restore_gold_file`."""
    path = world_dir(data) / "train.jsonl"
    shutil.copy2(path, data / "train.jsonl.good")
    path.write_text("".join(line[:len(line) // 2] + "\n"
                            for line in path.read_text().splitlines()))
    return str(path)


def restore_gold_file(data: Path) -> bool:
    """Put the train split back as it was before `corrupt_gold_file` (True when it was)."""
    good = data / "train.jsonl.good"
    if not good.is_file():
        return False
    path = world_dir(data) / "train.jsonl"
    write_jsonl(path, read_rows(good))
    good.unlink()
    return manifest_path(path).is_file()


# --- the steward


def _suspects(eval_dir: Path, name: str) -> list[dict[str, Any]]:
    path = eval_dir / name
    return read_rows(path) if path.is_file() else []


def decided_keys(overrides: Path) -> set[str]:
    """`split/id` of every row a steward already decided (a second decision on one would be
    a conflict, which apply-audit refuses)."""
    import yaml

    entries = yaml.safe_load(overrides.read_text()) if overrides.is_file() else None
    return {f"{e.get('split') or 'train'}/{e['id']}" for e in entries or []}


def pick_decisions(eval_dir: Path, train_rows: list[dict[str, Any]], corpus_text: str,
                   decided: set[str] = frozenset(),  # type: ignore[assignment]
                   ) -> tuple[list[dict[str, Any]], str]:
    """One `correct` (a train suspect) and one `accept` (another suspect) from the last run's
    audit queue (`eval_dir`'s suspect_labels*.jsonl), skipping rows already `decided`; without
    a train suspect a clean train row is corrected. Returns the rows and a note.

    `corpus_text`: the normalised passages, one per line. The correction is a whole-token span
    of one, as validation's answerability check requires (a span no passage holds, such as a
    policy's near-copy of a name, would be quarantined as unanswerable)."""
    train_sus = [s for s in _suspects(eval_dir, "suspect_labels_train.jsonl")
                 if s["key"] not in decided]
    test_sus = [s for s in _suspects(eval_dir, "suspect_labels.jsonl")
                if s["key"] not in decided]
    by_id = {r["id"]: r for r in train_rows}
    note = ""
    target = next((s for s in train_sus if s["example_id"] in by_id), None)
    if target is None:
        note = ("the audit queue held no undecided train suspect: a clean train row is "
                "corrected instead")
        first = next(r for r in train_rows if f"train/{r['id']}" not in decided)
        target = {"example_id": first["id"], "split": "train", "key": f"train/{first['id']}",
                  "golden_answers": first["golden_answers"], "answer": ""}
    gold = by_id[target["example_id"]]
    answer = str(target.get("answer") or "").strip()
    if (answer and answer not in gold["golden_answers"]
            and f" {normalize_answer(answer)} " in corpus_text):
        corrected, source = [answer], "the policy's answer (found in the corpus)"
    else:  # another row's answer (of the same type where one differs): one the corpus holds
        others = [r for r in train_rows if r["golden_answers"] != gold["golden_answers"]]
        other = next((r for r in others if r.get("type") == gold.get("type")), others[0])
        corrected, source = list(other["golden_answers"]), f"row {other['id']}'s answer"
    rows = [target | {"decision": "correct", "corrected_answers": corrected,
                      "reason": f"weekly steward: gold replaced by {source}",
                      "steward": STEWARD}]
    accept = next((s for s in [*train_sus, *test_sus] if s["key"] != target["key"]), None)
    if accept is None:  # a clean row, accepted as it stands (an override no check needs)
        note += ("; " if note else "") + "no second suspect: a clean train row is accepted"
        clean = next(r for r in train_rows if r["id"] != target["example_id"]
                     and f"train/{r['id']}" not in decided)
        accept = {"example_id": clean["id"], "split": "train", "key": f"train/{clean['id']}",
                  "golden_answers": clean["golden_answers"], "answer": ""}
    rows.append(accept | {"decision": "accept", "reason": "weekly steward: gold checked "
                          "against its passages and kept", "steward": STEWARD})
    return rows, note


def corpus_text(data: Path) -> str:
    return "".join(f" {normalize_answer(p['contents'])} \n"
                   for p in read_rows(world_dir(data) / "corpus.jsonl"))
