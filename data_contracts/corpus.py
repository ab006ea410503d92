"""Data contract for retrieval corpora (`corpus.jsonl` and every extra corpus).

Rules (each a GX expectation, each also in `row_schema`):
- id: present, a string, non-empty, unique within the corpus (uniqueness is GX only)
- contents: present, a string, 1..validate.max_passage_chars characters, not blank
- title: optional; when present a string

A corpus is not labelled data: a broken passage is fixed at the source, not quarantined, so a
failure here stops the stage (naming file, row and field).
"""

from __future__ import annotations

from typing import Annotated, Any

import great_expectations as gx
import great_expectations.expectations as gxe
import pandas as pd
from pydantic import BaseModel, ConfigDict, StringConstraints

from searchrl.config import ValidateConfig
from searchrl.validation.frames import corpus_frame

NAME = "corpus"


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return corpus_frame(rows)


def build_suite(cfg: ValidateConfig) -> gx.ExpectationSuite:
    def m(field: str, rule: str, check: str = "contract") -> dict[str, str]:
        return {"field": field, "rule": rule, "check": check}

    return gx.ExpectationSuite(name=NAME, expectations=[
        gxe.ExpectColumnValuesToNotBeNull(column="id", meta=m("id", "required")),
        gxe.ExpectColumnValuesToBeOfType(column="id", type_="str",
                                         meta=m("id", "must be a string")),
        gxe.ExpectColumnValueLengthsToBeBetween(column="id", min_value=1,
                                                meta=m("id", "must not be empty")),
        gxe.ExpectColumnValuesToBeUnique(column="id", meta=m("id", "must be unique in the corpus",
                                                            "duplicate_id")),
        gxe.ExpectColumnValuesToNotBeNull(column="contents", meta=m("contents", "required")),
        gxe.ExpectColumnValuesToBeOfType(column="contents", type_="str",
                                         meta=m("contents", "must be a string")),
        gxe.ExpectColumnValueLengthsToBeBetween(
            column="contents", min_value=1, max_value=cfg.max_passage_chars,
            meta=m("contents", f"length must be 1..{cfg.max_passage_chars} characters")),
        gxe.ExpectColumnValuesToMatchRegex(column="contents", regex=r"\S",
                                           meta=m("contents", "must not be blank")),
        gxe.ExpectColumnValuesToBeOfType(column="title", type_="str",
                                         meta=m("title", "must be a string when present")),
    ])


def row_schema(cfg: ValidateConfig) -> type[BaseModel]:
    class CorpusRow(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")

        id: Annotated[str, StringConstraints(min_length=1)]
        contents: Annotated[str, StringConstraints(max_length=cfg.max_passage_chars,
                                                   pattern=r"\S")]
        title: str | None = None

    return CorpusRow
