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
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from searchrl.config import ValidateConfig

SUITE_NAMES = ("gold_qa", "eval_set", "corpus")


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

    # GX logs every metric computation at INFO and draws progress bars; neither helps here.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        progress_bars=ProgressBarsConfig(globally=False),
        analytics_enabled=False,
    )
    return gx.get_context(mode="ephemeral", project_config=config)


class SuiteRunner:
    """One ephemeral GX context for a validation run; `run` validates one dataset."""

    def __init__(self, contracts_dir: Path, cfg: ValidateConfig) -> None:
        self.cfg = cfg
        self.modules = {name: load_suite(contracts_dir, name) for name in SUITE_NAMES}
        self._ctx = _context()
        self._n = 0

    def row_schema(self, suite: str) -> Any:
        return self.modules[suite].row_schema(self.cfg)

    def run(self, suite: str, dataset: str, rows: list[dict[str, Any]]) -> SuiteResult:
        """Validate `rows` (dicts, input order) against `suite`; row indices are 0-based."""
        import great_expectations as gx

        module = self.modules[suite]
        frame: pd.DataFrame = module.to_frame(rows)
        if len(frame) != len(rows):
            raise ContractError(f"{suite}.to_frame returned {len(frame)} rows for {len(rows)}")
        result = SuiteResult(suite=suite, dataset=dataset, rows=len(rows))
        if not rows:
            return result
        self._n += 1
        source = self._ctx.data_sources.add_pandas(f"{suite}_{self._n}")
        batch = source.add_dataframe_asset(dataset).add_batch_definition_whole_dataframe("all")
        built = module.build_suite(self.cfg)
        built.name = f"{built.name}_{self._n}"  # one context, many datasets: names must differ
        gx_suite = self._ctx.suites.add(built)
        definition = self._ctx.validation_definitions.add(
            gx.ValidationDefinition(name=f"{suite}_{self._n}", data=batch, suite=gx_suite))
        run = definition.run(batch_parameters={"dataframe": frame},
                             result_format={"result_format": "COMPLETE"})
        failures: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for res in run.results:
            conf = res.expectation_config
            meta = conf.meta or {}
            column = str(conf.kwargs.get("column", ""))
            fld = str(meta.get("field", column))
            rule = str(meta.get("rule", conf.type))
            check = str(meta.get("check", "contract"))
            exc = res.exception_info or {}
            if exc.get("raised_exception"):
                raise ContractError(f"suite {suite} on {dataset}: expectation {conf.type}"
                                    f"({column}) raised: {exc.get('exception_message')}")
            indices = res.result.get("unexpected_index_list") or []
            if not res.success and not indices:
                raise ContractError(f"suite {suite} on {dataset}: expectation {conf.type}"
                                    f"({column}) failed without row indices; use column-map "
                                    "expectations on clean derived columns")
            for idx in indices:
                failures[int(idx)].append((check, f"{fld}: {rule}"))
            result.outcomes.append(ExpectationOutcome(
                expectation=conf.type, field=fld, rule=rule, check=check,
                success=bool(res.success), unexpected_count=len(indices)))
        result.row_failures = dict(failures)
        return result
