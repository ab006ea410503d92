"""Data contract for the gold QA training set (`train`): GX suite + the same rules as a row model.

Rules (each a GX expectation, each also in `row_schema`):
- id: present, a string, non-empty, unique within the file (uniqueness is GX only: a table rule)
- question: present, a string, 1..validate.max_question_chars characters, not blank
- golden_answers: present, a non-empty list of strings, each not blank and at most
  validate.max_answer_chars characters
- hops: optional; when present an integer in 1..validate.max_hops
- type: optional; when present one of validate.allowed_types
- supporting_doc_ids: optional; when present a list of strings
"""

from __future__ import annotations

from typing import Annotated, Any

import great_expectations as gx
import great_expectations.expectations as gxe
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from searchrl.config import ValidateConfig
from searchrl.validation.frames import OK, qa_frame

NAME = "gold_qa"
HOPS_REQUIRED = False


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return qa_frame(rows)


def qa_expectations(cfg: ValidateConfig, hops_required: bool) -> list[gxe.Expectation]:
    """The QA rules, shared by the gold QA and the evaluation-set contracts."""
    def m(field: str, rule: str, check: str = "contract") -> dict[str, str]:
        return {"field": field, "rule": rule, "check": check}

    rules: list[gxe.Expectation] = [
        gxe.ExpectColumnValuesToNotBeNull(column="id", meta=m("id", "required")),
        gxe.ExpectColumnValuesToBeOfType(column="id", type_="str",
                                         meta=m("id", "must be a string")),
        gxe.ExpectColumnValueLengthsToBeBetween(column="id", min_value=1,
                                                meta=m("id", "must not be empty")),
        gxe.ExpectColumnValuesToBeUnique(column="id", meta=m("id", "must be unique within the file",
                                                            "duplicate_id")),
        gxe.ExpectColumnValuesToNotBeNull(column="question", meta=m("question", "required")),
        gxe.ExpectColumnValuesToBeOfType(column="question", type_="str",
                                         meta=m("question", "must be a string")),
        gxe.ExpectColumnValueLengthsToBeBetween(
            column="question", min_value=1, max_value=cfg.max_question_chars,
            meta=m("question", f"length must be 1..{cfg.max_question_chars} characters")),
        gxe.ExpectColumnValuesToMatchRegex(column="question", regex=r"\S",
                                           meta=m("question", "must not be blank")),
        gxe.ExpectColumnValuesToNotBeNull(column="n_answers",
                                          meta=m("golden_answers", "required")),
        gxe.ExpectColumnValuesToBeInSet(column="answers_ok", value_set=[OK],
                                        meta=m("golden_answers", "must be a list of strings")),
        gxe.ExpectColumnValuesToBeBetween(column="n_answers", min_value=1,
                                          meta=m("golden_answers", "must not be empty")),
        gxe.ExpectColumnValuesToBeBetween(column="shortest_answer_chars", min_value=1,
                                          meta=m("golden_answers", "no answer may be blank")),
        gxe.ExpectColumnValuesToBeBetween(
            column="longest_answer_chars", max_value=cfg.max_answer_chars,
            meta=m("golden_answers", f"each answer at most {cfg.max_answer_chars} characters")),
        gxe.ExpectColumnValuesToBeInSet(column="hops_ok", value_set=[OK],
                                        meta=m("hops", "must be an integer")),
        gxe.ExpectColumnValuesToBeBetween(column="hops", min_value=1, max_value=cfg.max_hops,
                                          meta=m("hops", f"must be in 1..{cfg.max_hops}")),
        gxe.ExpectColumnValuesToBeInSet(
            column="type", value_set=list(cfg.allowed_types),
            meta=m("type", "must be one of validate.allowed_types")),
        gxe.ExpectColumnValuesToBeInSet(column="supporting_ok", value_set=[OK],
                                        meta=m("supporting_doc_ids", "must be a list of strings")),
    ]
    if hops_required:
        rules.append(gxe.ExpectColumnValuesToNotBeNull(column="hops_ok",
                                                       meta=m("hops", "required")))
    return rules


def build_suite(cfg: ValidateConfig) -> gx.ExpectationSuite:
    return gx.ExpectationSuite(name=NAME, expectations=qa_expectations(cfg, HOPS_REQUIRED))


def qa_row_schema(cfg: ValidateConfig, hops_required: bool, name: str) -> type[BaseModel]:
    """The QA rules as a strict pydantic row model (bounds from the config)."""
    allowed = frozenset(cfg.allowed_types)
    question_t = Annotated[str, StringConstraints(max_length=cfg.max_question_chars,
                                                  pattern=r"\S")]
    answer_t = Annotated[str, StringConstraints(max_length=cfg.max_answer_chars, pattern=r"\S")]
    hops_t = Annotated[int, Field(ge=1, le=cfg.max_hops)]

    class QARow(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")

        id: Annotated[str, StringConstraints(min_length=1)]
        question: question_t
        golden_answers: Annotated[list[answer_t], Field(min_length=1)]
        hops: hops_t | None = None
        type: str | None = None
        supporting_doc_ids: list[str] | None = None

        @field_validator("type")
        @classmethod
        def _allowed_type(cls, value: str | None) -> str | None:
            if value is not None and value not in allowed:
                raise ValueError(f"must be one of validate.allowed_types {sorted(allowed)}")
            return value

    if hops_required:
        class QARowHops(QARow):
            hops: hops_t  # type: ignore[assignment]

        QARowHops.__name__ = name
        return QARowHops
    QARow.__name__ = name
    return QARow


def row_schema(cfg: ValidateConfig) -> type[BaseModel]:
    return qa_row_schema(cfg, HOPS_REQUIRED, "GoldQARow")
