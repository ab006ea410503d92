"""What every section shares: the error type, the section base class, and the declaration of
which results (stages and keyed artifacts) each field shapes, read by every cache key."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names file, key and fix."""



# --- what each result depends on: declared once, per field, in the section modules
#
# Every field says which results its value changes (`Annotated[T, shapes(...)]`); a field
# without a marker takes its section's `SHAPES`, a nested section's fields take that
# section's `SHAPES` or else the marker of the field holding it. `OPERATIONAL` (ports,
# timeouts, rate limits, logging, threads) changes no result. Stage cache keys
# (tasks/_common.py), checkpoint run identity (train/grpo/checkpoint.py), the cold-start key and
# the index components' keys (retrieval/index_store.py) are all `PipelineConfig.inputs_of`
# one of these results, plus the content fingerprints of their data inputs.

STAGE_NAMES = ("validate_gold_labels", "build_index", "filter_curriculum", "train_policy",
               "evaluate_policy", "decide_go_no_go")
# Artifacts with keys of their own, and the stages that build or reuse them: a field that
# shapes one shapes those stages too.
BUILT_BY: dict[str, tuple[str, ...]] = {
    "cold_start": ("filter_curriculum", "train_policy"),  # the SFT policy RL starts from
    "train_run": ("train_policy",),  # whose checkpoints a run may resume
    "index.bm25": ("build_index",),
    "index.dense": ("build_index",),  # passage embeddings
    "index.faiss": ("build_index",),
}
RESULTS = STAGE_NAMES + tuple(BUILT_BY)


@dataclass(frozen=True)
class Shapes:
    """Field marker: the results a field's value changes (empty: operational)."""

    results: frozenset[str]


def shapes(*results: str) -> Shapes:
    unknown = sorted(set(results) - set(RESULTS))
    if unknown:
        raise ValueError(f"unknown results {unknown}; known: {RESULTS}")
    return Shapes(frozenset(results))


OPERATIONAL = Shapes(frozenset())
# Everything that runs the policy: the cold start it is trained from, the difficulty estimate,
# training (and which checkpoints it may resume) and evaluation.
POLICY = shapes("cold_start", "filter_curriculum", "train_policy", "train_run",
                "evaluate_policy")
# What changes search results: the index stage (its recall figures) and every stage whose
# rollouts search, the cold start's demonstrations included.
SEARCH = shapes("build_index", *POLICY.results)



def union_of(*marks: Shapes) -> Shapes:
    return Shapes(frozenset().union(*(m.results for m in marks)))


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    # The results this section's fields shape unless a field says otherwise (None: those of
    # the field holding the section).
    SHAPES: ClassVar[Shapes | None] = None




# Bounds of settings under which a stage learns nothing or cannot run: field -> (operator,
# bound, why). Checked at load, so `train.steps=0` fails there, not as a "trained" policy.
Bound = tuple[Literal[">=", ">"], float, str]


def check_bounds(where: str, section: BaseModel, bounds: Mapping[str, Bound]) -> None:
    """ValueError naming `<where>.<field>=<value>`, the bound and why, for the first field
    out of its bound (None passes: it means "not set")."""
    for name, (op, bound, why) in bounds.items():
        value = getattr(section, name)
        if value is None:
            continue
        ok = math.isfinite(value) and (value >= bound if op == ">=" else value > bound)
        if not ok:
            raise ValueError(f"{where}.{name}={value}: must be {op} {bound:g}" + why)



def inputs_of(section: BaseModel, result: str) -> dict[str, Any]:
    """`PipelineConfig.inputs_of` for any section (e.g. `inputs_of(config.index,
    "index.bm25")`: the BM25 component's build settings)."""
    if result not in RESULTS:
        raise ValueError(f"unknown result {result!r}; known: {RESULTS}")
    return _inputs_of(section, section.model_dump(mode="json", by_alias=True), result, None)


def field_shapes(section: type[BaseModel], name: str, inherited: Shapes | None) -> Shapes:
    """The results field `name` of `section` shapes (`BUILT_BY` expanded): its own marker,
    else the section's `SHAPES`, else `inherited` (the marker of the field holding it)."""
    info = section.model_fields[name]
    marks = [m for m in info.metadata if isinstance(m, Shapes)]
    own = getattr(section, "SHAPES", None)
    mark = marks[0] if marks else own if own is not None else inherited
    if mark is None:
        raise TypeError(f"{section.__name__}.{name}: no result declaration (add SHAPES to "
                        "the section or a shapes(...) marker to the field)")
    built = [shapes(*BUILT_BY[r]) for r in mark.results if r in BUILT_BY]
    return union_of(mark, *built)


def _inputs_of(model: BaseModel, dumped: dict[str, Any], result: str,
               inherited: Shapes | None) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        key = info.alias or name
        value = getattr(model, name)
        if isinstance(value, Section):
            marks = [m for m in info.metadata if isinstance(m, Shapes)]
            holder = marks[0] if marks else getattr(type(model), "SHAPES", None) or inherited
            nested = _inputs_of(value, dumped[key], result, holder)
            if nested:
                kept[key] = nested
        elif result in field_shapes(type(model), name, inherited).results:
            kept[key] = dumped[key]
    return kept
