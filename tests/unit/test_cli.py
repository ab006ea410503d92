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
    assert main(["validate", *small]) == 0
    counts = json.loads(capsys.readouterr().out.split("\n}\n", 1)[1])
    assert counts["rows_in"] == counts["clean"] + counts["quarantined"]


def test_stage_without_its_inputs_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="run `python -m searchrl validate` first"):
        main(["index", f"run.work_dir={tmp_path}"])
