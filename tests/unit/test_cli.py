from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchrl.__main__ import main
from searchrl.exit_codes import EXIT_CODES, exit_code_of, report_error
from searchrl.stages import REF_FORMAT

ROOT = Path(__file__).resolve().parents[2]


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
    written = json.loads((tmp_path / "validate_gold_labels" / "ref.json").read_text())
    assert written == {"format_version": REF_FORMAT, **ref}  # stamped with its layout
    assert all(Path(p).exists() for p in ref["files"])  # files, and the gold digest dir
    counts = json.loads((tmp_path / "validate_gold_labels" / "audit.json").read_text())["counts"]
    assert counts["rows_in"] == counts["clean"] + counts["quarantined"]
    # The next stage reads that reference; once a file it names is gone it says what to re-run.
    Path(ref["paths"]["dev"]).unlink()
    assert main(["index", *small]) == 3  # a stage's input missing or stale
    assert "re-run `python -m searchrl validate`" in capsys.readouterr().err


def test_stage_without_its_inputs_says_what_to_run(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", f"run.work_dir={tmp_path}"]) == 3
    assert "run `python -m searchrl validate` first" in capsys.readouterr().err


def test_train_rank_is_the_rank_entry_point_and_reads_the_train_inputs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # What DeepSpeed's launcher starts for each rank (with --local_rank); it reads the same
    # upstream references as the train stage and never launches again.
    assert main(["train-rank", "--local_rank=0", "train.launch.mode=deepspeed",
                 "train.launch.ranks=2", f"run.work_dir={tmp_path}"]) == 3
    assert "run `python -m searchrl validate` first" in capsys.readouterr().err
    assert not (tmp_path / "train_policy" / "launch").exists()


# --- expected errors: the message alone on stderr, a distinct exit code; tracebacks are bugs


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "searchrl", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd or ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def _expect(proc: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and says in proc.stderr, proc.stderr[-3000:]


def test_help_documents_the_exit_codes() -> None:
    proc = _cli("--help")
    assert proc.returncode == 0 and "exit codes:" in proc.stdout
    for entry in EXIT_CODES:
        assert f"{entry.code:>3}  {entry.meaning}" in proc.stdout.replace("\n      ", " ")


def test_a_config_error_exits_2_with_the_message_alone() -> None:
    _expect(_cli("config", "train.steps=0"), 2, "train.steps=0: must be >= 1")


def _leaky_world(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    from tests.contracts.test_bad_lines import _world

    world = _world(tmp_path)  # train shares questions with test (leakage), a truncated line
    world["validate"]["max_quarantine_fraction"] = 0.05
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(world))
    return config, world


def test_expected_errors_of_the_stages_exit_with_their_codes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, world = _leaky_world(tmp_path)
    capsys.readouterr()
    assert main(["validate", "--config", str(config)]) == 6
    err = capsys.readouterr().err
    assert "Traceback" not in err and "above validate.max_quarantine_fraction=0.05" in err
    world["data"]["train_path"] = str(tmp_path / "absent.jsonl")
    config.write_text(yaml.safe_dump(world))
    assert main(["validate", "--config", str(config)]) == 4
    assert capsys.readouterr().err.strip().endswith(
        "absent.jsonl: file not found (data.train_path)")
    assert main(["index", "--config", str(config)]) == 3
    assert "run `python -m searchrl validate` first" in capsys.readouterr().err


@pytest.mark.slow  # a process that loads the validation stack (~20-60 s on 2 shared cores)
def test_leakage_over_the_threshold_exits_6_with_the_message_alone(tmp_path: Path) -> None:
    config, _ = _leaky_world(tmp_path)
    proc = _cli("validate", "--config", str(config))
    _expect(proc, 6, "quarantined, above validate.max_quarantine_fraction=0.05")
    assert proc.stderr.strip().splitlines()[-1].startswith(tuple("0123456789"))  # the message


def test_every_class_in_the_table_exists_and_a_bug_keeps_its_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:

    classes = {c.__name__: c for c in _searchrl_exceptions()}
    named = [name for entry in EXIT_CODES for name in entry.errors]
    assert set(named) <= set(classes), set(named) - set(classes)
    assert len({entry.code for entry in EXIT_CODES}) == len(EXIT_CODES)
    from searchrl.retrieval.service import ServiceError

    assert exit_code_of(ServiceError("refused")) == 7
    # A retriever that failed a stage, and a gate refusing an evaluation with failed searches,
    # are expected errors with their own codes (not a bug's 70, nor the NO-GO's 1).
    from searchrl.rl.rollout import RetrieverFailedError
    from searchrl.stages import GateInputError

    assert exit_code_of(RetrieverFailedError("3 of 3 search calls failed")) == 7
    assert exit_code_of(GateInputError("failed searches")) == 10
    assert exit_code_of(KeyError("x")) is None  # not ours: a bug
    try:
        {}["x"]
    except KeyError as exc:
        assert report_error(exc) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "a bug" in err


def _searchrl_exceptions() -> list[type[BaseException]]:
    seen: list[type[BaseException]] = []
    todo: list[type[BaseException]] = [Exception]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("searchrl"):
                seen.append(sub)
    return seen


@pytest.mark.slow  # imports Prefect, torch and every task (~30 s on 2 shared cores)
def test_the_flow_script_exits_with_the_code_and_the_message_alone() -> None:
    proc = subprocess.run([sys.executable, "flows/pipeline.py", "--config", "configs/tiny.yaml",
                           "train.steps=0"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    _expect(proc, 2, "train.steps=0: must be >= 1")


def test_every_stage_command_reads_exactly_the_references_its_stage_takes() -> None:
    # Keyword options after `sink` (searchers=...) are not inputs: a launched rank once took
    # the sink for an upstream reference and died with KeyError.
    from searchrl.__main__ import STAGE_COMMANDS
    from searchrl.sinks import MetricsSink
    from searchrl.stages import STAGES

    produced = {STAGES[name].output_kind() for name in STAGE_COMMANDS.values()}
    kinds = {command: [kind.__name__ for kind, _ in STAGES[name].input_kinds()]
             for command, name in STAGE_COMMANDS.items()}
    assert kinds == {"validate": [], "index": ["DatasetRef"],
                     "curriculum": ["DatasetRef", "IndexRef"],
                     "train": ["DatasetRef", "IndexRef", "CurriculumRef"],
                     "evaluate": ["DatasetRef", "IndexRef", "CheckpointRef"],
                     "gate": ["DatasetRef", "CurriculumRef", "CheckpointRef", "EvalRef"]}
    for name in STAGE_COMMANDS.values():
        assert all(kind in produced and kind is not MetricsSink
                   for kind, _ in STAGES[name].input_kinds())
    assert [optional for _, optional in STAGES["train_policy"].input_kinds()] == [
        False, False, True]
    # The gate charges the curriculum its own reference recorded (None: not counted, said so).
    assert [optional for _, optional in STAGES["decide_go_no_go"].input_kinds()] == [
        False, True, False, False]
    assert {name: s.upstream() for name, s in STAGES.items()} == {
        "validate_gold_labels": [], "build_index": ["validate_gold_labels"],
        "filter_curriculum": ["validate_gold_labels", "build_index"],
        "train_policy": ["validate_gold_labels", "build_index", "filter_curriculum"],
        "evaluate_policy": ["validate_gold_labels", "build_index", "train_policy"],
        "decide_go_no_go": ["validate_gold_labels", "filter_curriculum", "train_policy",
                            "evaluate_policy"]}
