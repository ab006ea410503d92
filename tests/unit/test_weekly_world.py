"""What a simulated week changes in the world (searchrl/simulation/world.py), on a small world
written as files: held-back rows arrive, the corpus changes by edits, additions and removals
of passages no question cites, the steward never decides a row twice, and a corrupted gold
file is restored as it was; and the week table and figure are drawn from week records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.config import load_config
from searchrl.datasets.io import read_manifest
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.world import write_world
from searchrl.simulation import report
from searchrl.simulation import world as wd


@pytest.fixture
def data(tmp_path: Path) -> Path:
    config = load_config("configs/tiny.yaml", [
        "data.synthetic.n_people=30", "data.synthetic.n_organisations=8",
        "data.synthetic.n_train=20", "data.synthetic.n_dev=4", "data.synthetic.n_test=4"])
    write_world(generate_world(config.data.synthetic), wd.world_dir(tmp_path))
    wd.hold_back(tmp_path, 6)
    return tmp_path


def test_rows_arrive_and_the_corpus_changes_only_where_no_question_looks(data: Path) -> None:
    world = wd.world_dir(data)
    before = {p["id"]: p for p in wd.read_rows(world / "corpus.jsonl")}
    train_before = len(wd.read_rows(world / "train.jsonl"))
    arrived = wd.release_rows(data, 4)
    assert len(arrived) == 4
    assert len(wd.read_rows(world / "train.jsonl")) == train_before + 4
    assert len(wd.read_rows(data / "held_back_train.jsonl")) == 2

    change = wd.change_corpus(data, week=3, edited=2, added=2, removed=2)
    after = {p["id"]: p for p in wd.read_rows(world / "corpus.jsonl")}
    cited = {d for s in ("train", "dev", "test") for r in wd.read_rows(world / f"{s}.jsonl")
             for d in r.get("supporting_doc_ids", [])}
    assert len(change.passages_edited) == len(change.passages_removed) == 2
    assert set(change.passages_removed).isdisjoint(after)
    assert set(change.passages_added) <= set(after) and not set(change.passages_added) & set(
        before)
    assert all(after[p]["contents"].endswith("after week 3.") for p in change.passages_edited)
    assert not (set(change.passages_edited) | set(change.passages_removed)) & cited
    # Written with its manifest: the file and its row count agree.
    manifest = read_manifest(world / "corpus.jsonl")
    assert manifest is not None and manifest["rows"] == len(after) == len(before)


def test_the_steward_never_decides_a_row_twice(data: Path, tmp_path: Path) -> None:
    train = wd.read_rows(wd.world_dir(data) / "train.jsonl")
    text = wd.corpus_text(data)
    first, _ = wd.pick_decisions(tmp_path / "no_eval", train, text)
    assert [r["decision"] for r in first] == ["correct", "accept"]
    assert first[0]["corrected_answers"] != first[0]["golden_answers"]
    decided = {r["key"] for r in first}
    second, note = wd.pick_decisions(tmp_path / "no_eval", train, text, decided)
    assert "no undecided train suspect" in note
    assert not decided & {r["key"] for r in second}


def test_a_corrupted_gold_file_is_restored_as_it_was(data: Path) -> None:
    path = wd.world_dir(data) / "train.jsonl"
    good = path.read_text()
    wd.corrupt_gold_file(data)
    with pytest.raises(json.JSONDecodeError):
        wd.read_rows(path)
    assert wd.restore_gold_file(data) and path.read_text() == good
    assert not wd.restore_gold_file(data)  # nothing left to restore


def _week(n: int, *, completed: bool, fault: str | None = None) -> dict[str, object]:
    return {"week": n, "fault": fault, "seconds": 10.0 * n, "completed": completed,
            "attempts": [{"exit_code": 0 if completed else 7, "seconds": 10.0 * n,
                          "killed": False, "message": "" if completed else "down: :9"}],
            "runs": [{"status": "FINISHED", "stages": ["a", "b"]}],
            "decision": {"go": False, "reasons": []},
            "registry": {"champion": None, "challenger": {"version": str(n), "em": 0.0,
                                                          "decision": "NO-GO"}},
            "quarantine": {"splits": {"train": {"rows_in": 5, "clean": 4, "quarantined": 1}},
                           "accounted": True},
            "disk": {"total": 2 * report.MB, "work": report.MB, "mlflow_artifacts": 0,
                     "mlflow_db": 0, "prefect_results": 0, "world": 0, "embedding_cache": 0}}


def test_the_week_table_and_figure(tmp_path: Path) -> None:
    weeks = [_week(1, completed=True), _week(2, completed=False, fault="retriever_down")]
    table = report.weeks_table(weeks).splitlines()
    assert len(table) == 4
    assert ("| 2 | retriever_down | 20 | 2 | FAILED exit 7: down: :9 | - | v2 | 1 (accounted: "
            "True)") in table[3]
    weeks[1]["runs"] = [{"status": "FAILED", "stages": ["validate_gold_labels"]}]
    assert report.quarantined(weeks[1]) == "- (validation refused the files)"
    assert "NO-GO" in report.week_line(weeks[0])
    assert report.plot_weeks(weeks, tmp_path / "weeks.png").stat().st_size > 0
