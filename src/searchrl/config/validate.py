"""Stage 1: gold-label validation."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from searchrl.config.base import Section, shapes

GoldCheck = Literal[
    "parse", "contract", "duplicate_id", "schema", "answer_variant", "duplicate_question",
    "conflicting_gold", "leakage_exact", "leakage_near", "unanswerable", "not_in_supporting",
    "unknown_supporting_doc", "time_sensitive",
]


class ValidateConfig(Section):
    """Gold-label validation. Rules of the GX suites live in `contracts_dir`; checks listed in
    `quarantine_checks` move a row to quarantine, every other flag only asks for review."""

    SHAPES = shapes("validate_gold_labels")

    max_quarantine_fraction: float = Field(0.2, ge=0.0, le=1.0)
    # A QA set or corpus whose added + removed + changed rows pass this share of the reference
    # gold set's (the champion's, else the last validated one) is a warning in the audit
    # report and the `drift_warnings` metric (searchrl.validation.drift); it never fails a run.
    drift_warn_fraction: float = Field(0.1, ge=0.0)
    # Steward decisions (accept / correct a flagged row); None -> no overrides.
    overrides_path: Path | None = Path("data_contracts/overrides.yaml")
    contracts_dir: Path = Path("data_contracts")
    max_question_chars: int = Field(1000, ge=1)
    max_answer_chars: int = Field(300, ge=1)
    max_passage_chars: int = Field(20000, ge=1)
    max_hops: int = Field(4, ge=1)
    allowed_types: tuple[str, ...] = (
        # HotpotQA, 2WikiMultihopQA, MuSiQue (Nhop), single-hop sets (datasets/prepare/layouts.py)
        "bridge", "comparison", "compositional", "inference", "bridge_comparison", "single",
        "1hop", "2hop", "3hop", "4hop",
        # the synthetic world's question templates (searchrl.datasets.synthetic.SYNTHETIC_TYPES)
        "person_birth_city", "city_country", "country_capital", "org_founder", "org_hq_city",
        "person_birth_country", "org_founder_birth_city", "org_hq_country",
        "org_founder_birth_country", "person_birth_country_capital",
        # the reading world's further types (searchrl.datasets.reading_world.READING_TYPES)
        "person_birth_year", "org_founded_year", "org_founder_birth_year",
        "compare_org_founded", "compare_person_born",
    )
    # Token-set Jaccard of normalised questions at/above which train vs eval is leakage.
    near_duplicate_threshold: float = Field(0.9, gt=0.0, le=1.0)
    time_sensitive_terms: tuple[str, ...] = ("current", "currently", "latest", "this year", "now")
    # Judgement answers that are not spans of any passage: never looked up in the corpus.
    non_extractive_answers: tuple[str, ...] = ("yes", "no")
    # Evaluation sets must carry `hops` (per-hop accuracy); off for sets without it (NQ).
    eval_requires_hops: bool = False
    # parse / contract / duplicate_id / schema quarantine even when left out (the row is
    # unusable as it stands); they are listed so the default reads complete.
    quarantine_checks: tuple[GoldCheck, ...] = (
        "parse", "contract", "duplicate_id", "schema", "duplicate_question", "conflicting_gold",
        "leakage_exact", "leakage_near", "unanswerable", "unknown_supporting_doc",
    )
