"""The cold start's pass@k (`curriculum.run.cold_start_pass_at_k`, printed by
benchmarks/bench_train.py, tabulated by bench_candidates.py): read from what the curriculum
stage writes (its own `write_artifacts`), dropped questions (never / always solved) counted."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from searchrl.curriculum.difficulty import QuestionDifficulty, filter_by_difficulty
from searchrl.curriculum.run import cold_start_pass_at_k, write_artifacts
from searchrl.datasets.io import fingerprint
from searchrl.types import QAExample
from tests.conftest import REPO_ROOT


def test_pass_at_k_and_pass_at_1_from_the_curriculum_estimate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rates = [0.0, 0.0, 0.125, 0.5, 1.0]  # of 8 samples each: 3 of 5 solved at least once
    examples = [QAExample(id=f"q{i}", question=f"q{i}?", golden_answers=("a",), hops=1)
                for i in range(len(rates))]
    difficulties = [QuestionDifficulty(example_id=ex.id, hops=1, samples=8, pass_rate=r,
                                       mean_searches=1.0) for ex, r in zip(examples, rates,
                                                                           strict=True)]
    result = filter_by_difficulty(difficulties, min_pass_rate=0.0, max_pass_rate=1.0,
                                  order="easy_to_hard")
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "model.safetensors").write_bytes(b"weights")
    write_artifacts(examples, result, difficulties, tmp_path / "filter_curriculum",
                    policy_fingerprint=fingerprint(sft), data_fingerprint="d")
    bench = runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_train.py"),
                           run_name="bench_train")
    got = cold_start_pass_at_k(tmp_path / "filter_curriculum")
    assert got["questions"] == 5 and got["k"] == [8]
    assert got["pass_at_k"] == pytest.approx(3 / 5)
    assert got["pass_at_1"] == pytest.approx(sum(rates) / 5)
    assert cold_start_pass_at_k(tmp_path / "none") is None

    bench["print_cold_start_pass"](tmp_path / "filter_curriculum", sft)
    assert "pass@8 0.600, pass@1 0.325 (this cold start" in capsys.readouterr().out
    (sft / "model.safetensors").write_bytes(b"other weights")
    bench["print_cold_start_pass"](tmp_path / "filter_curriculum", sft)
    assert "(NOT this cold start" in capsys.readouterr().out
