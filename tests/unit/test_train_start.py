"""The train stage's start policy (train/start.py): prepared once, before any rank runs, and
recorded for the ranks; which cold start it makes or reuses under train.init=base and
champion, with and without the rejection-sampling comparator and a curriculum stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from searchrl.config import PipelineConfig
from searchrl.refs import StageInputError
from searchrl.sinks import NullSink
from searchrl.train import start as start_module
from searchrl.train.cold_start.build import SFT_KEY_FILE
from searchrl.train.start import StartPolicy, prepare_start, read_start
from searchrl.types import CurriculumRef, DatasetRef
from tests.train_fixture import tiny_config


def _config(tmp_path: Path, *, init: str, rs: bool) -> PipelineConfig:
    cfg = tiny_config(tmp_path)
    train = cfg.train.model_copy(update={
        "init": init,
        "rejection_sampling": cfg.train.rejection_sampling.model_copy(update={"enabled": rs})})
    return cfg.model_copy(update={"train": train})


def _dataset(tmp_path: Path) -> DatasetRef:
    split = tmp_path / "train.jsonl"
    split.write_text('{"id": "q1", "question": "Where?", "golden_answers": ["Oslo"]}\n')
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "p1", "contents": "\\"Oslo\\"\\nA city."}\n')
    return DatasetRef(paths={"train": str(split)}, fingerprints={}, corpus_path=str(corpus),
                      corpus_fingerprint="", fingerprint="")


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """The cold starts made (a stand-in that writes the dir the real one would)."""
    made: list[Path] = []

    def fake_cold_start(config: Any, train: Any, passages: Any, searcher: Any, out_dir: Path,
                        sink: Any = None) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text("{}")
        (out_dir / SFT_KEY_FILE).write_text("{}")
        made.append(out_dir)
        return out_dir

    champion = tmp_path / "work" / "train_policy" / "champion_start"
    monkeypatch.setattr(start_module, "cold_start", fake_cold_start)
    monkeypatch.setattr(start_module, "fetch_champion_start",
                        lambda config, out_dir, uri: champion if config.train.init == "champion"
                        else None)
    return made


def _prepare(tmp_path: Path, config: PipelineConfig, curriculum: CurriculumRef | None = None
             ) -> StartPolicy:
    out = tmp_path / "work" / "train_policy"
    out.mkdir(parents=True, exist_ok=True)
    got = prepare_start(config, _dataset(tmp_path), curriculum, None,  # type: ignore[arg-type]
                        out, NullSink())
    assert read_start(out) == got  # what every rank reads
    return got


def test_base_starts_from_the_cold_start_made_once(tmp_path: Path, built: list[Path]) -> None:
    got = _prepare(tmp_path, _config(tmp_path, init="base", rs=True))
    cold = tmp_path / "work" / "train_policy" / "sft"
    assert built == [cold]
    assert got.policy_dir == got.sft_dir == got.cold_dir == cold


def test_champion_without_the_comparator_makes_no_cold_start(tmp_path: Path,
                                                              built: list[Path]) -> None:
    got = _prepare(tmp_path, _config(tmp_path, init="champion", rs=False))
    champion = tmp_path / "work" / "train_policy" / "champion_start"
    assert built == [] and got == StartPolicy(champion, champion, 0.0, None)


def test_champion_with_the_comparator_reuses_the_curriculum_stages_cold_start(
        tmp_path: Path, built: list[Path]) -> None:
    cold = tmp_path / "work" / "train_policy" / "sft"
    cold.mkdir(parents=True)
    (cold / "config.json").write_text("{}")
    (cold / SFT_KEY_FILE).write_text("{}")
    curriculum = CurriculumRef(train_path="x", fingerprint="")
    got = _prepare(tmp_path, _config(tmp_path, init="champion", rs=True), curriculum)
    assert built == []  # as the curriculum stage made it: vouched for by its reference
    assert got.sft_dir == got.cold_dir == cold  # the SFT baseline stays the cold start


def test_champion_with_the_comparator_and_no_curriculum_makes_it_before_the_ranks(
        tmp_path: Path, built: list[Path]) -> None:
    got = _prepare(tmp_path, _config(tmp_path, init="champion", rs=True))
    champion = tmp_path / "work" / "train_policy" / "champion_start"
    assert built == [tmp_path / "work" / "train_policy" / "sft"] and got.cold_dir == built[0]
    # No cold start existed when the stage began: the champion is the SFT baseline, as the
    # evaluation measured it when the comparator made the cold start after GRPO.
    assert got.policy_dir == got.sft_dir == champion and got.seconds == 0.0


def test_a_rank_alone_is_refused_naming_the_stage_to_run(tmp_path: Path) -> None:
    with pytest.raises(StageInputError, match=r"start\.json not found.*python -m searchrl "
                                              r"train`, not a rank alone"):
        read_start(tmp_path)
