"""Where the QA sets and corpora come from: the synthetic world's settings or files."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import Field, model_validator

from searchrl.config.base import Section, shapes
from searchrl.paths import plain_name_problem


class SyntheticWorldConfig(Section):
    # The cold start draws demonstrations from extra worlds made with these settings.
    SHAPES = shapes("validate_gold_labels", "cold_start")
    # `reading` (datasets/reading_world.py): several phrasings per relation (some only in dev and
    # test), aliases, facts outside the entity's own passage, namesakes, comparisons, an
    # answer-novel slice: a world a fixed script cannot ace. `classic` (datasets/synthetic.py): one
    # phrasing per relation, kept for regression (a regex script scores EM 1.000 on it).
    profile: Literal["reading", "classic"] = "reading"
    seed: int = 13
    # World seeds whose dev splits hyperparameters were chosen on (recorded, never evaluated
    # as a headline): the report says a world is sealed only when its seed is not one of them.
    tuning_seeds: Annotated[tuple[int, ...], shapes("decide_go_no_go")] = ()
    n_people: int = 120
    n_cities: int = 40
    n_countries: int = 12
    n_organisations: int = 30
    n_train: int = 400
    n_dev: int = 60
    n_test: int = 120
    hop_mix: dict[int, float] = Field(default_factory=lambda: {1: 0.3, 2: 0.5, 3: 0.2})
    distractors_per_entity: int = 1

    @model_validator(mode="after")
    def _check_hop_mix(self) -> SyntheticWorldConfig:
        bad = [h for h in self.hop_mix if h not in (1, 2, 3)]
        if bad:
            raise ValueError(f"hop_mix keys must be 1, 2 or 3 (got {bad})")
        if abs(sum(self.hop_mix.values()) - 1.0) > 1e-6 or min(self.hop_mix.values()) < 0:
            raise ValueError(f"hop_mix weights must be >= 0 and sum to 1 (got {self.hop_mix})")
        return self


# Extra eval set / corpus names the pipeline's own sets hold: `main` is the main corpus's
# index, the split names are validation's clean files and audit labels.
RESERVED_SET_NAMES = frozenset({"main", "train", "dev", "test"})


def check_set_names(where: str, names: Iterable[str]) -> None:
    """ValueError naming the first unusable extra eval set / corpus name under `where`.

    The names become file and directory names (validation's copies, the index's <name>/,
    evaluation's sets/<name>/) and labels beside the pipeline's own sets: each must be a
    plain name (`paths.plain_name_problem`), not reserved, and not differ from another
    only in case."""
    folded: dict[str, str] = {}
    for name in names:
        problem = plain_name_problem(name)
        if problem is None and name in RESERVED_SET_NAMES:
            problem = (f"is reserved (the pipeline's own sets: {sorted(RESERVED_SET_NAMES)}); "
                       "choose another name")
        if problem is not None:
            raise ValueError(f"{where} name {name!r} {problem}")
        other = folded.setdefault(name.lower(), name)
        if other != name:
            raise ValueError(f"{where} names {other!r} and {name!r} differ only in case: one "
                             "file on a case-insensitive file system")


class DataConfig(Section):
    SHAPES = shapes("validate_gold_labels")
    source: Literal["synthetic", "files"] = "synthetic"
    synthetic: SyntheticWorldConfig = SyntheticWorldConfig()
    # For source=files: each a JSONL/JSON/parquet file, a `datasets` save_to_disk dir,
    # or `hf://<name>[:<config>]@<split>` where the machine is online.
    train_path: str | None = None
    dev_path: str | None = None
    test_path: str | None = None
    corpus_path: str | None = None
    # Extra real-text eval sets (validated, indexed, recall measured): name -> QA path.
    extra_eval: dict[str, str] = Field(default_factory=dict)
    extra_corpus: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _files_need_paths(self) -> DataConfig:
        if self.source == "files":
            missing = [
                k for k in ("train_path", "test_path", "corpus_path") if getattr(self, k) is None
            ]
            if missing:
                raise ValueError(f"data.source=files needs {missing}")
        return self

    @model_validator(mode="after")
    def _plain_set_names(self) -> DataConfig:
        check_set_names("data.extra_eval", self.extra_eval)
        check_set_names("data.extra_corpus", self.extra_corpus)
        return self
