"""Every override mistake a user can type exits 2 with the key, what was given, what is
expected and how to quote it; no traceback, and nothing written (issue 34 §2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl.__main__ import main
from searchrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "tiny.yaml")
# `data.synthetic.hop_mix={1: 0.2, 2: 0.35, 3: 0.45}` typed without quotes, as argv holds it
SPLIT_HOP_MIX = ["data.synthetic.hop_mix={1:", "0.2,", "2:", "0.35,", "3:", "0.45}"]

CASES = [
    # (words after the config, fragments the message must hold)
    (SPLIT_HOP_MIX, ["data.synthetic.hop_mix", "looks shell-split: quote the whole value",
                     "data.synthetic.hop_mix='{1: 0.2, 2: 0.35, 3: 0.45}'",
                     "dict[int, float]"]),
    (["train.lr=[1"], ["train.lr", "'[1' is not a YAML value", "expected float",
                       "train.lr=0.0002"]),
    (["data.synthetic.hop_mix={1:"], ["'{1:' is not a YAML value",
                                      "data.synthetic.hop_mix='{1: 0.3, 2: 0.5, 3: 0.2}'"]),
    (["train.stpes=3"], ["unknown key 'train.stpes'", "did you mean 'train.steps'",
                         "valid keys under train:", "questions_per_step"]),
    (["trian.steps=3"], ["unknown key 'trian'", "did you mean 'train'"]),
    (["run.seed.x=1"], ["run.seed is a value", "int", "not a section"]),
    (["train..steps=3"], ["'train..steps' has an empty part"]),
    (["train.steps=many"], ["train.steps", "got 'many'", "expected int (default: 60)",
                            "train.steps=60"]),
    (["index.retriever=bm52"], ["index.retriever", "got 'bm52'", "'bm25'", "'hybrid'",
                                "index.retriever=hybrid"]),
    (["train.steps="], ["train.steps=: empty value", "expected int", "train.steps=null",
                        "train.steps=\"''\""]),
    (["run.work_dir="], ["run.work_dir=: empty value", "expected Path"]),
    (["run.work_dir=''"], ["run.work_dir='' is the current directory", "runs/<run.name>"]),
    (["run.work_dir=."], ["run.work_dir='.' is the current directory"]),
    (["run.name=team/a"], ["run.name='team/a' cannot name the registered model", "'team_a'"]),
    (["run.name=@x"], ["run.name", "'@x' is not a YAML value", "run.name=\"'@x'\""]),
    (["run.name=my", "run"], ["then 'run', not key.sub=value", "run.name='my run'"]),
    (["train.steps"], ["override 'train.steps': expected key.sub=value"]),
    (["train.steps", "=", "3"], ["no spaces around '='"]),
]


@pytest.mark.parametrize(("words", "says"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_override_exits_2_with_the_fix_and_writes_nothing(
        words: list[str], says: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # the default and any relative run.work_dir land here
    code = main(["validate", "--config", CONFIG, *words])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for fragment in says:
        assert fragment in err, (fragment, err)
    assert list(tmp_path.iterdir()) == []


def test_good_overrides_still_apply() -> None:
    config = load_config(CONFIG, [
        "data.synthetic.hop_mix={1: 0.2, 2: 0.35, 3: 0.45}",  # quoted: one word
        "data.extra_eval.extra=sets/extra.jsonl",  # a key inside a mapping field
        "run.name=qwen2.5-3b_v2",  # dots are fine in a run name
        "eval.frontier.base_url=http://127.0.0.1:8001/v1",  # into a section the file leaves null
        "eval.frontier.model=m", "eval.frontier.price_per_1k_prompt_tokens=0.001",
        "eval.frontier.price_per_1k_completion_tokens=0.002",
        "index.query_prefix=''",  # an empty string spelt as YAML (shell: ...=\"''\")
    ])
    assert config.data.synthetic.hop_mix == {1: 0.2, 2: 0.35, 3: 0.45}
    assert config.data.extra_eval["extra"] == "sets/extra.jsonl"
    assert config.run.name == "qwen2.5-3b_v2"
    assert config.eval.frontier is not None and config.eval.frontier.model == "m"
    assert config.index.query_prefix == ""


def _expect_split_refused(proc: subprocess.CompletedProcess[str], work_dir: Path) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "looks shell-split: quote the whole value" in proc.stderr
    assert "data.synthetic.hop_mix='{1: 0.2, 2: 0.35, 3: 0.45}'" in proc.stderr
    assert not work_dir.exists()


def test_the_cli_refuses_a_shell_split_value(tmp_path: Path) -> None:
    work_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "searchrl", "validate", "--config", CONFIG,
         f"run.work_dir={work_dir}", *SPLIT_HOP_MIX],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    _expect_split_refused(proc, work_dir)


@pytest.mark.slow  # imports Prefect, torch and every task (~20-30 s on 2 shared cores)
def test_the_flow_script_refuses_a_shell_split_value(tmp_path: Path) -> None:
    work_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "flows" / "pipeline.py"), "--config", CONFIG,
         f"run.work_dir={work_dir}", *SPLIT_HOP_MIX],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    _expect_split_refused(proc, work_dir)
