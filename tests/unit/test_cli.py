from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.__main__ import main


def test_config_prints_resolved_config_with_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--config", "configs/tiny.yaml", "train.steps=3"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["steps"] == 3


def test_bad_key_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "train.stepz=3"]) == 2
    assert "train.stepz" in capsys.readouterr().err


def test_generate_world_and_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = ["data.synthetic.n_people=40", "data.synthetic.n_organisations=10",
             f"run.work_dir={tmp_path}"]
    assert main(["generate-world", *small, "--out", str(tmp_path / "world")]) == 0
    assert (tmp_path / "world" / "corpus.jsonl").is_file()
    capsys.readouterr()
    assert main(["validate", *small]) == 0
    ref = json.loads(capsys.readouterr().out)  # the stage's DatasetRef, also in its ref.json
    assert json.loads((tmp_path / "validate_gold_labels" / "ref.json").read_text()) == ref
    assert all(Path(p).is_file() for p in ref["files"])
    counts = json.loads((tmp_path / "validate_gold_labels" / "audit.json").read_text())["counts"]
    assert counts["rows_in"] == counts["clean"] + counts["quarantined"]
    # The next stage reads that reference; once a file it names is gone it says what to re-run.
    Path(ref["paths"]["dev"]).unlink()
    assert main(["index", *small]) == 2
    assert "re-run `python -m searchrl validate`" in capsys.readouterr().err


def test_stage_without_its_inputs_says_what_to_run(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", f"run.work_dir={tmp_path}"]) == 2
    assert "run `python -m searchrl validate` first" in capsys.readouterr().err


def test_train_rank_is_the_rank_entry_point_and_reads_the_train_inputs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # What DeepSpeed's launcher starts for each rank (with --local_rank); it reads the same
    # upstream references as the train stage and never launches again.
    assert main(["train-rank", "--local_rank=0", "train.launch.mode=deepspeed",
                 "train.launch.ranks=2", f"run.work_dir={tmp_path}"]) == 2
    assert "run `python -m searchrl validate` first" in capsys.readouterr().err
    assert not (tmp_path / "train_policy" / "launch").exists()
