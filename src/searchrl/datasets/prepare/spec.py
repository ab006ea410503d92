"""prepare-data's spec (the YAML `--spec` names) and the names of the files it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from searchrl.config import check_set_names
from searchrl.datasets.io import DataError, read_user_text
from searchrl.paths import safe_filename

QALayout = Literal["auto", "search_r1", "flashrag", "nq_open", "triviaqa", "popqa", "hotpotqa",
                   "2wiki", "musique"]
# flashrag == search_r1: `{id, contents}` with an optional `"Title"\n` first line (wiki-18);
# title_text: DPR-style `{id, title, text}`, stored in the wiki-18 form.
CorpusLayout = Literal["auto", "flashrag", "search_r1", "title_text"]

PREPARED = "prepared.json"
DATA_YAML = "data.yaml"
CORPUS = "corpus.jsonl"



# --- the spec


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QASourceSpec(_Spec):
    """One QA source: a file/dir/`hf://` spec as `searchrl.datasets.io` reads, its layout and an
    optional row cap (a seeded sample, not the head, so the cap does not bias the mix)."""

    source: str = Field(min_length=1)
    layout: QALayout = "auto"
    max_rows: int | None = Field(None, ge=1)
    # Recorded per row; None -> the part / eval set name ("dev" for the dev set).
    data_source: str | None = None


class TrainPartSpec(QASourceSpec):
    name: str = Field(min_length=1)


class CorpusSpec(_Spec):
    source: str | None = None
    layout: CorpusLayout = "auto"
    # Build the corpus from the QA rows' own paragraphs (HotpotQA/2Wiki `context`, MuSiQue
    # `paragraphs`): the distractor setting, and the only way to get supporting_doc_ids.
    from_questions: bool = False

    @model_validator(mode="after")
    def _one_origin(self) -> CorpusSpec:
        if (self.source is None) == (not self.from_questions):
            raise ValueError("corpus needs exactly one of `source` or `from_questions: true`")
        return self


class PrepareSpec(_Spec):
    train: tuple[TrainPartSpec, ...] = Field(min_length=1)
    eval: dict[str, QASourceSpec] = Field(min_length=1)
    corpus: CorpusSpec
    dev: QASourceSpec | None = None
    # The eval set that becomes data.test_path; None -> the first. The rest become extra_eval.
    primary_eval: str | None = None
    seed: int = 0
    shuffle: bool = True

    @model_validator(mode="after")
    def _names(self) -> PrepareSpec:
        names = [p.name for p in self.train]
        if len(set(names)) != len(names):
            raise ValueError(f"train part names must be unique (got {names})")
        files = [safe_filename(n) for n in self.eval]
        if len(set(files)) != len(files):
            raise ValueError(f"eval set names must differ as file names (got {list(self.eval)})")
        if self.primary_eval is not None and self.primary_eval not in self.eval:
            raise ValueError(f"primary_eval {self.primary_eval!r} is not an eval set "
                             f"({list(self.eval)})")
        # The others become data.extra_eval names: checked here, before hours of work.
        check_set_names("eval (data.extra_eval)", [n for n in self.eval if n != self.primary])
        return self

    @property
    def primary(self) -> str:
        return self.primary_eval or next(iter(self.eval))


def load_spec(path: str | Path) -> PrepareSpec:
    """Read a spec YAML; DataError names the file and the offending key."""
    path = Path(path)
    text = read_user_text(path, "prepare spec (--spec)")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return PrepareSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
                             for e in exc.errors())
        raise DataError(f"{path}: invalid prepare spec: {problems}") from exc
