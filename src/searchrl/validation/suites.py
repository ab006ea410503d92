"""Run the Great Expectations suites in `data_contracts/` and attribute failures to rows.

A suite module (`data_contracts/<name>.py`) defines:

- `to_frame(rows) -> pandas.DataFrame`: one frame row per input row, same order;
- `build_suite(cfg: ValidateConfig) -> gx.ExpectationSuite`: every expectation carries
  `meta={"field": ..., "rule": ..., "check": "contract" | "duplicate_id"}`, so a failure
  becomes a per-row reason naming the field and the rule;
- `row_schema(cfg: ValidateConfig) -> type[pydantic.BaseModel]`: the same contract as a row
  model (tests check the two agree row by row on the fixtures).

Suites run in an ephemeral GX context (nothing written to disk, no project folder). Only
column-map expectations are used, so every failure has an index list to attribute.

A dataset too large for one frame (a wiki-scale corpus) runs through `SuiteRunner.chunked`:
the suite runs on each chunk's frame in turn and the per-row verdicts are added up with the
chunk's offset; uniqueness, the one rule that spans chunks, is kept out of the per-chunk suite
and decided over the whole dataset from an 8-byte hash per row (rows whose hashes collide are
compared by value at the end). The result equals `run` on all rows at once (tests check this).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from searchrl.config import ValidateConfig

SUITE_NAMES = ("gold_qa", "eval_set", "corpus")
UNIQUE = "expect_column_values_to_be_unique"


class ContractError(RuntimeError):
    """A suite module is missing or malformed, or a corpus breaks its contract."""


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result over one dataset, for the report."""

    expectation: str
    field: str
    rule: str
    check: str
    success: bool
    unexpected_count: int


@dataclass
class SuiteResult:
    """A suite run over one dataset: per-expectation outcomes and per-row (check, reason)s."""

    suite: str
    dataset: str
    rows: int
    outcomes: list[ExpectationOutcome] = field(default_factory=list)
    row_failures: dict[int, list[tuple[str, str]]] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)


def load_suite(contracts_dir: Path, name: str) -> ModuleType:
    """Import `<contracts_dir>/<name>.py` and check it defines the three suite functions."""
    path = Path(contracts_dir) / f"{name}.py"
    if not path.is_file():
        raise ContractError(f"{path}: data contract suite not found (validate.contracts_dir="
                            f"{contracts_dir}; run from the repository root or set it)")
    module_name = f"searchrl_data_contracts_{name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ContractError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    missing = [f for f in ("to_frame", "build_suite", "row_schema") if not hasattr(module, f)]
    if missing:
        raise ContractError(f"{path}: suite module must define {missing}")
    return module


def _context() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )
    from great_expectations.execution_engine import pandas_execution_engine

    # GX logs every metric computation at INFO and draws progress bars; neither helps here.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    # Every frame under this many bytes gets a batch "fingerprint" (a hash of all its values)
    # that nothing here reads: a third of the suite's time on a corpus chunk.
    pandas_execution_engine.HASH_THRESHOLD = 0
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        progress_bars=ProgressBarsConfig(globally=False),
        analytics_enabled=False,
    )
    return gx.get_context(mode="ephemeral", project_config=config)


class SuiteRunner:
    """One ephemeral GX context for a validation run; `run` validates one dataset."""

    def __init__(self, contracts_dir: Path, cfg: ValidateConfig) -> None:
        self.contracts_dir, self.cfg = Path(contracts_dir), cfg
        self.modules = {name: load_suite(contracts_dir, name) for name in SUITE_NAMES}
        self._ctx = _context()
        self._n = 0

    def row_schema(self, suite: str) -> Any:
        return self.modules[suite].row_schema(self.cfg)

    def _frame(self, suite: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
        frame: pd.DataFrame = self.modules[suite].to_frame(rows)
        if len(frame) != len(rows):
            raise ContractError(f"{suite}.to_frame returned {len(frame)} rows for {len(rows)}")
        return frame

    def _definition(self, suite: str, dataset: str, keep: Callable[[Any], bool]) -> Any:
        """A validation definition of `suite`'s expectations that `keep` accepts, on a
        whole-dataframe batch (the frame comes with each run)."""
        import great_expectations as gx

        self._n += 1
        source = self._ctx.data_sources.add_pandas(f"{suite}_{self._n}")
        batch = source.add_dataframe_asset(dataset).add_batch_definition_whole_dataframe("all")
        built = self.modules[suite].build_suite(self.cfg)
        built.name = f"{built.name}_{self._n}"  # one context, many datasets: names must differ
        built.expectations = [e for e in built.expectations if keep(e)]
        gx_suite = self._ctx.suites.add(built)
        return self._ctx.validation_definitions.add(
            gx.ValidationDefinition(name=f"{suite}_{self._n}", data=batch, suite=gx_suite))

    def run(self, suite: str, dataset: str, rows: list[dict[str, Any]]) -> SuiteResult:
        """Validate `rows` (dicts, input order) against `suite`; row indices are 0-based."""
        frame = self._frame(suite, rows)
        result = SuiteResult(suite=suite, dataset=dataset, rows=len(rows))
        if not rows:
            return result
        definition = self._definition(suite, dataset, lambda _: True)
        failures: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for verdict in _validate(definition, frame, suite, dataset):
            for idx in verdict.indices:
                failures[idx].append((verdict.check, verdict.reason))
            result.outcomes.append(verdict.outcome(len(verdict.indices)))
        result.row_failures = dict(failures)
        return result

    def chunked(self, suite: str, dataset: str) -> ChunkedRun:
        """A run of `suite` over a dataset fed in chunks (`ChunkedRun.add`, then `finish`)."""
        return ChunkedRun(self, suite, dataset)


@dataclass
class Verdict:
    """One expectation's verdict on one frame: its rows that failed (frame positions)."""

    expectation: str
    column: str
    field: str
    rule: str
    check: str
    success: bool
    indices: list[int]

    @property
    def reason(self) -> str:
        return f"{self.field}: {self.rule}"

    def outcome(self, unexpected: int) -> ExpectationOutcome:
        return ExpectationOutcome(expectation=self.expectation, field=self.field, rule=self.rule,
                                  check=self.check, success=self.success,
                                  unexpected_count=unexpected)


def _describe(conf: Any) -> tuple[str, str, str, str]:
    """(column, field, rule, check) of an expectation configuration, from its meta."""
    meta = conf.meta or {}
    column = str(conf.kwargs.get("column", ""))
    return (column, str(meta.get("field", column)), str(meta.get("rule", conf.type)),
            str(meta.get("check", "contract")))


def _validate(definition: Any, frame: pd.DataFrame, suite: str, dataset: str) -> list[Verdict]:
    run = definition.run(batch_parameters={"dataframe": frame},
                         result_format={"result_format": "COMPLETE"})
    verdicts = []
    for res in run.results:
        conf = res.expectation_config
        column, fld, rule, check = _describe(conf)
        exc = res.exception_info or {}
        if exc.get("raised_exception"):
            raise ContractError(f"suite {suite} on {dataset}: expectation {conf.type}"
                                f"({column}) raised: {exc.get('exception_message')}")
        indices = [int(i) for i in res.result.get("unexpected_index_list") or []]
        if not res.success and not indices:
            raise ContractError(f"suite {suite} on {dataset}: expectation {conf.type}"
                                f"({column}) failed without row indices; use column-map "
                                "expectations on clean derived columns")
        verdicts.append(Verdict(conf.type, column, fld, rule, check, bool(res.success),
                                 indices))
    return verdicts


class ChunkedRun:
    """`SuiteRunner.run` over rows that arrive in chunks, in memory flat in their number.

    Each chunk's frame goes through the suite without its uniqueness expectations (one GX
    validation definition serves every chunk); those are decided in `finish` over all rows:
    a non-null value's 64-bit hash per row (9 bytes a row with its null mark), the hashes
    sorted, and the rows whose hashes repeat compared by value (`values_of`, asked only for
    them). Failing rows are kept (row -> reasons), so memory grows with failures, not rows.
    A chunk's suite (`check`) may run in a worker process; what spans chunks (`add`: the
    verdicts merged in chunk order, the hashes) stays in the run's own process.
    """

    def __init__(self, runner: SuiteRunner, suite: str, dataset: str) -> None:
        self.runner, self.suite, self.dataset = runner, suite, dataset
        full = runner.modules[suite].build_suite(runner.cfg)
        # Expectation order is the suite's: a row's reasons come in that order, as in `run`.
        self._order = [(e.expectation_type, _describe(e.configuration)) for e in
                       full.expectations]
        self._unique = [i for i, (kind, _) in enumerate(self._order) if kind == UNIQUE]
        self._definition: Any = None
        self._verdicts: dict[int, Verdict] = {}  # per-chunk expectation, merged over chunks
        self._hashes: dict[int, list[np.ndarray]] = {i: [] for i in self._unique}
        self._valid: dict[int, list[np.ndarray]] = {i: [] for i in self._unique}
        self.rows = 0

    def check(self, rows: list[dict[str, Any]], frame: pd.DataFrame | None = None
              ) -> list[Verdict]:
        """A chunk's verdicts on the expectations checked per chunk (failing rows as chunk
        positions), nothing recorded: the part of `add` another process may run, with a
        `ChunkedRun` of the same suite and config of its own."""
        if not rows:
            return []
        if frame is None:
            frame = self.runner._frame(self.suite, rows)
        if self._definition is None:
            self._definition = self.runner._definition(
                self.suite, self.dataset, lambda e: e.expectation_type != UNIQUE)
        verdicts = _validate(self._definition, frame, self.suite, self.dataset)
        expected = len(self._order) - len(self._unique)
        if len(verdicts) != expected:
            raise ContractError(f"suite {self.suite}: {len(verdicts)} results for "
                                f"{expected} expectations")
        return verdicts

    def add(self, rows: list[dict[str, Any]], verdicts: list[Verdict] | None = None
            ) -> set[int]:
        """The next chunk (rows in dataset order) with its `check` verdicts (checked here when
        None); returns its rows (dataset positions) that failed an expectation checked per
        chunk (uniqueness is known only at `finish`)."""
        failed: set[int] = set()
        if not rows:
            return failed
        frame = self.runner._frame(self.suite, rows)
        if verdicts is None:
            verdicts = self.check(rows, frame)
        per_chunk = [i for i in range(len(self._order)) if i not in self._unique]
        for i, v in zip(per_chunk, verdicts, strict=True):
            merged = self._verdicts.setdefault(i, Verdict(v.expectation, v.column, v.field,
                                                           v.rule, v.check, True, []))
            merged.success = merged.success and v.success
            merged.indices.extend(self.rows + k for k in v.indices)
            failed.update(self.rows + k for k in v.indices)
        for i in self._unique:
            column = frame[self._order[i][1][0]]
            valid = column.notna().to_numpy()
            self._valid[i].append(valid)
            self._hashes[i].append(np.fromiter(
                (hash(x) if ok else 0 for x, ok in zip(column, valid, strict=True)),
                dtype=np.int64, count=len(column)))
        self.rows += len(rows)
        return failed

    def finish(self, values_of: Callable[[str, set[int]], dict[int, Any]]) -> SuiteResult:
        """The result over every row added. `values_of(column, rows)` returns the column's
        value of each of those rows (0-based, dataset order): the caller reads them again."""
        result = SuiteResult(suite=self.suite, dataset=self.dataset, rows=self.rows)
        if not self.rows:
            return result
        for i in self._unique:
            kind, (column, fld, rule, check) = self._order[i]
            dups = _duplicate_rows(np.concatenate(self._hashes.pop(i)),
                                   np.concatenate(self._valid.pop(i)), column, values_of)
            self._verdicts[i] = Verdict(kind, column, fld, rule, check, not dups, dups)
        failures: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for i in range(len(self._order)):
            verdict = self._verdicts[i]
            for idx in verdict.indices:
                failures[idx].append((verdict.check, verdict.reason))
            result.outcomes.append(verdict.outcome(len(verdict.indices)))
        result.row_failures = {k: failures[k] for k in sorted(failures)}
        return result


def _duplicate_rows(hashes: np.ndarray, valid: np.ndarray, column: str,
                    values_of: Callable[[str, set[int]], dict[int, Any]]) -> list[int]:
    """Rows whose (non-null) value occurs more than once, ascending."""
    rows = np.flatnonzero(valid)
    order = np.argsort(hashes[rows], kind="stable")
    ranked = hashes[rows][order]
    repeat = np.zeros(len(ranked), dtype=bool)
    repeat[1:] |= ranked[1:] == ranked[:-1]
    repeat[:-1] |= ranked[1:] == ranked[:-1]
    candidates = {int(r) for r in rows[order][repeat]}
    if not candidates:
        return []
    by_value: dict[Any, list[int]] = defaultdict(list)
    for row, value in values_of(column, candidates).items():
        by_value[value].append(row)
    return sorted(r for group in by_value.values() if len(group) > 1 for r in group)


def rows_values(rows: Iterable[dict[str, Any]], to_frame: Callable[..., pd.DataFrame]
                ) -> Callable[[str, set[int]], dict[int, Any]]:
    """`ChunkedRun.finish`'s `values_of` over rows held in memory (tests, small datasets)."""
    held = list(rows)

    def values_of(column: str, wanted: set[int]) -> dict[int, Any]:
        frame = to_frame([held[i] for i in sorted(wanted)])
        return dict(zip(sorted(wanted), frame[column], strict=True))

    return values_of
