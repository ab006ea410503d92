"""The GX suites in data_contracts/ and their pydantic row schemas: good fixtures pass, every
planted defect in the bad fixtures is caught on the right field, and the two agree row by row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from searchrl.config import ValidateConfig
from searchrl.datasets.io import read_raw_qa_rows
from searchrl.validation.suites import ContractError, SuiteRunner, load_suite

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "contracts"
SUITES = ("gold_qa", "eval_set", "corpus")


@pytest.fixture(scope="module")
def runner() -> SuiteRunner:
    return SuiteRunner(ROOT / "data_contracts", ValidateConfig(eval_requires_hops=True))


def _rows(suite: str, kind: str) -> list[dict[str, Any]]:
    path = FIXTURES / f"{suite}_{kind}.jsonl"
    if suite == "corpus":  # passages as written, so a wrongly typed title reaches the suite
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [raw for _, raw in read_raw_qa_rows(path)]


def _schema_ok(schema: Any, raw: dict[str, Any]) -> bool:
    try:
        schema.model_validate(raw)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("suite", SUITES)
def test_good_fixture_passes_suite_and_schema(runner: SuiteRunner, suite: str) -> None:
    rows = _rows(suite, "good")
    result = runner.run(suite, f"{suite}_good", rows)
    assert result.success, [o for o in result.outcomes if not o.success]
    assert result.row_failures == {}
    schema = runner.row_schema(suite)
    assert all(_schema_ok(schema, r) for r in rows)


@pytest.mark.parametrize("suite", SUITES)
def test_bad_fixture_each_defect_caught_on_its_field(runner: SuiteRunner, suite: str) -> None:
    rows = _rows(suite, "bad")
    result = runner.run(suite, f"{suite}_bad", rows)
    assert not result.success
    for i, raw in enumerate(rows):
        reasons = [reason for _, reason in result.row_failures.get(i, [])]
        assert reasons, f"row {i + 1} ({raw['_defect']} defect) passed the suite"
        assert any(r.startswith(f"{raw['_defect']}:") for r in reasons), (i + 1, reasons)


@pytest.mark.parametrize("suite", SUITES)
def test_pydantic_schema_agrees_with_suite_row_by_row(runner: SuiteRunner, suite: str) -> None:
    schema = runner.row_schema(suite)
    for kind in ("good", "bad"):
        rows = _rows(suite, kind)
        result = runner.run(suite, f"{suite}_{kind}_agree", rows)
        for i, raw in enumerate(rows):
            row_level = [c for c, _ in result.row_failures.get(i, []) if c != "duplicate_id"]
            assert _schema_ok(schema, raw) == (not row_level), (kind, i + 1, raw, row_level)


def test_duplicate_ids_flag_every_copy(runner: SuiteRunner) -> None:
    rows = [{"id": "a", "question": "q1?", "golden_answers": ["x"]},
            {"id": "b", "question": "q2?", "golden_answers": ["x"]},
            {"id": "a", "question": "q3?", "golden_answers": ["x"]}]
    result = runner.run("gold_qa", "dupes", rows)
    assert {i: [c for c, _ in f] for i, f in result.row_failures.items()} == \
        {0: ["duplicate_id"], 2: ["duplicate_id"]}


def test_bounds_come_from_config() -> None:
    strict = SuiteRunner(ROOT / "data_contracts", ValidateConfig(max_question_chars=10))
    rows = [{"id": "a", "question": "short?", "golden_answers": ["x"]},
            {"id": "b", "question": "a much longer question?", "golden_answers": ["x"]}]
    result = strict.run("gold_qa", "bounds", rows)
    assert list(result.row_failures) == [1]
    assert not _schema_ok(strict.row_schema("gold_qa"), rows[1])


def test_missing_suite_module_names_path(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"gold_qa\.py"):
        load_suite(tmp_path, "gold_qa")


def test_eval_hops_requirement_follows_config() -> None:
    lax = SuiteRunner(ROOT / "data_contracts", ValidateConfig(eval_requires_hops=False))
    rows = [{"id": "a", "question": "No hop count?", "golden_answers": ["x"]}]
    assert lax.run("eval_set", "no_hops", rows).row_failures == {}
    assert _schema_ok(lax.row_schema("eval_set"), rows[0])
