"""Data contract for evaluation sets (`dev`, `test`, every `extra_eval:<name>`).

The gold QA rules (see gold_qa.py) plus, with `validate.eval_requires_hops: true`, hops is
required: evaluation reports accuracy per hop count and a row without it would silently fall
out of that breakdown. Off by default, since single-hop sets (NQ) carry no hop count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import great_expectations as gx
import pandas as pd
from pydantic import BaseModel

from searchrl.config import ValidateConfig
from searchrl.validation.suites import load_suite

NAME = "eval_set"
_gold = load_suite(Path(__file__).resolve().parent, "gold_qa")


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame: pd.DataFrame = _gold.to_frame(rows)
    return frame


def build_suite(cfg: ValidateConfig) -> gx.ExpectationSuite:
    return gx.ExpectationSuite(name=NAME,
                               expectations=_gold.qa_expectations(cfg, cfg.eval_requires_hops))


def row_schema(cfg: ValidateConfig) -> type[BaseModel]:
    schema: type[BaseModel] = _gold.qa_row_schema(cfg, cfg.eval_requires_hops,
                                                         "EvalSetRow")
    return schema
