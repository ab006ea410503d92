"""Shared by the contract tests: the planted-defect world's config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig

ROOT = Path(__file__).resolve().parents[2]
DEFECTS = ROOT / "tests" / "fixtures" / "contracts" / "defects"


def make_defects_config(tmp_path: Path, **validate: Any) -> PipelineConfig:
    """Files source over tests/fixtures/contracts/defects; no threshold, no overrides."""
    return PipelineConfig.model_validate({
        "run": {"name": "defects", "work_dir": str(tmp_path / "run")},
        "data": {"source": "files", "train_path": str(DEFECTS / "train.jsonl"),
                 "dev_path": str(DEFECTS / "dev.jsonl"),
                 "test_path": str(DEFECTS / "test.jsonl"),
                 "corpus_path": str(DEFECTS / "corpus.jsonl")},
        "validate": {"max_quarantine_fraction": 1.0, "overrides_path": None,
                     "eval_requires_hops": True,
                     "contracts_dir": str(ROOT / "data_contracts"), **validate},
    })

