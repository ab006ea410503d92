"""Record types shared by every stage, and the small frozen references stages pass each other.

Stages never pass DataFrames, indexes, tensors or models: only these references
(paths + content hashes + the MLflow run id that produced them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class QAExample(BaseModel):
    """One question with its gold answers (Search-R1 / FlashRAG layout)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    golden_answers: tuple[str, ...] = Field(min_length=1)
    hops: int | None = None
    type: str | None = None
    supporting_doc_ids: tuple[str, ...] = ()
    # The gold search queries, hop by hop (empty: the supporting passages' titles), for worlds
    # where a hop is searched by an alias or a namesake's disambiguated title.
    search_queries: tuple[str, ...] = ()
    # Named slices the question belongs to (`searchrl.datasets.reading_world.SLICE_CARD` says what
    # each tests): unseen_phrasing, answer_novel, alias, namesake, cross_passage, comparison.
    slices: tuple[str, ...] = ()

    @field_validator("question")
    @classmethod
    def _question_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("question is blank")
        return value

    @field_validator("golden_answers")
    @classmethod
    def _answers_not_blank(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not a.strip() for a in value):
            raise ValueError("golden_answers contains a blank answer")
        return value


class Passage(BaseModel):
    """One corpus passage (`{id, contents}` as Search-R1's retriever reads, title optional)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1)
    title: str | None = None
    contents: str = Field(min_length=1)


@dataclass(frozen=True)
class SearchHit:
    doc_id: str
    title: str | None
    contents: str
    score: float


# --- references passed between pipeline stages
#
# Every reference lists the files it stands for in `files` (path -> content fingerprint as
# `searchrl.datasets.io.fingerprint` computes it when the stage finished), so a cached reference
# can be checked against the disk before it is reused (`searchrl.stages.ref_is_current`).


@dataclass(frozen=True)
class _StageOutput:
    """What every reference carries (keyword-only, after the reference's own fields)."""

    files: dict[str, str] = field(default_factory=dict, kw_only=True)
    mlflow_run_id: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class _CostedOutput(_StageOutput):
    """A stage that holds devices: its wall time and devices (ranks), priced by the gate."""

    seconds: float = field(default=0.0, kw_only=True)
    devices: int = field(default=1, kw_only=True)


@dataclass(frozen=True)
class DatasetRef(_StageOutput):
    """A validated dataset: split (`train`, `dev`, `test`) -> file path, the main corpus, the
    extra eval sets (name -> QA file path) and the corpora they are searched in (name -> path;
    extra eval set `n` in extra corpus `n`)."""

    paths: dict[str, str]
    fingerprints: dict[str, str]  # split -> content fingerprint
    corpus_path: str
    corpus_fingerprint: str
    fingerprint: str
    extra_corpora: dict[str, str] = field(default_factory=dict)
    extra_evals: dict[str, str] = field(default_factory=dict)
    report_path: str | None = None
    # The validated set's digest (searchrl.validation.drift); on GO the gate keeps it as the
    # champion's, the reference the next validation's drift is measured against.
    digest_dir: str | None = None


@dataclass(frozen=True)
class IndexRef(_StageOutput):
    index_dir: str
    fingerprint: str
    retriever: str


@dataclass(frozen=True)
class CurriculumRef(_CostedOutput):
    train_path: str
    fingerprint: str
    difficulty_path: str | None = None
    dropped_path: str | None = None
    # The difficulty estimate's correct samples, which rejection sampling
    # (train/rejection_sampling.py) fine-tunes on instead of sampling the same policy again.
    samples_path: str | None = None


@dataclass(frozen=True)
class CheckpointRef(_CostedOutput):
    policy_dir: str
    fingerprint: str
    sft_dir: str | None = None
    metrics_path: str | None = None
    # (`seconds` 0: not recorded; the gate then uses training_seconds)
    training_seconds: float = 0.0
    # Resumed after an interruption: earlier attempts' training seconds up to the checkpoint
    # resumed from, included in `seconds` and `training_seconds`.
    earlier_attempts_seconds: float = 0.0
    # Which policy `policy_dir` is (train.keep_best): "best", the best dev evaluation by
    # `select_metric`, or "last"; the last step's policy is `last_policy_dir` either way.
    selection: str = "last"
    selected_step: int | None = None
    last_policy_dir: str | None = None
    last_step: int | None = None
    select_metric: str | None = None
    selected_value: float | None = None  # the select metric at selected_step / last_step
    last_value: float | None = None
    stopped_early: bool = False  # train.early_stop_patience ended training at last_step
    # train.rejection_sampling: the SFT policy fine-tuned on its own correct samples (None:
    # disabled), evaluated as the `rejection_sampling` system, and its build time (as recorded
    # when built; a reused one keeps that figure). Not in `seconds`: the stage's time is the
    # GRPO policy's cost, rs_seconds the comparator's.
    rs_dir: str | None = None
    rs_seconds: float = 0.0


@dataclass(frozen=True)
class EvalRef(_CostedOutput):
    results_path: str
    fingerprint: str


@dataclass(frozen=True)
class Decision(_StageOutput):
    go: bool
    reasons: tuple[str, ...]
    report_html: str | None = None
    report_md: str | None = None
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> Literal["GO", "NO-GO"]:
        return "GO" if self.go else "NO-GO"


StageRef = DatasetRef | IndexRef | CurriculumRef | CheckpointRef | EvalRef | Decision
