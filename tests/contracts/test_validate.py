"""End to end: a world with one planted defect per check class is validated; each defect is
caught with the right reason, clean + quarantined = input, steward overrides apply, the
threshold stops the run after writing the report, and the default synthetic world is clean."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from searchrl.config import PipelineConfig
from searchrl.datasets.io import read_manifest, read_qa
from searchrl.validation.overrides import OverridesError, load_overrides
from searchrl.validation.suites import ContractError
from searchrl.validation.validate import (
    QuarantineThresholdError,
    ValidationResult,
    validate_gold_labels,
)
from tests.contracts.conftest import make_defects_config

ROOT = Path(__file__).resolve().parents[2]

# (split, id) -> the checks planted on that row, and whether it must end in quarantine.
PLANTED: dict[tuple[str, str], tuple[set[str], bool]] = {
    ("train", "t1"): (set(), False),
    ("train", "t2"): ({"answer_variant"}, False),
    ("train", "t3"): ({"conflicting_gold"}, True),
    ("train", "t4"): ({"conflicting_gold"}, True),
    ("train", "t5"): (set(), False),
    ("train", "t6"): ({"duplicate_question"}, True),
    ("train", "t7"): ({"leakage_exact"}, True),
    ("train", "t8"): ({"leakage_near"}, True),
    ("train", "t9"): ({"unanswerable"}, True),
    ("train", "t10"): ({"not_in_supporting"}, False),
    ("train", "t11"): ({"unknown_supporting_doc"}, True),
    ("train", "t12"): ({"time_sensitive"}, False),
    ("train", "t13"): ({"contract"}, True),
    ("train", "dup"): ({"duplicate_id"}, True),
    ("train", "t17"): ({"contract"}, True),
    ("train", "t18"): ({"contract"}, True),
    ("train", "t19"): ({"contract"}, True),
    ("dev", "d1"): (set(), False),
    ("test", "e1"): (set(), False),
    ("test", "e2"): (set(), False),
    ("test", "e3"): ({"answer_variant"}, False),
    ("test", "e4"): ({"answer_variant", "duplicate_question"}, True),
    ("test", "e5"): ({"contract"}, True),
}


def _flags_by_row(result: ValidationResult) -> dict[tuple[str, str], list[dict[str, Any]]]:
    assert result.audit_path is not None
    audit = json.loads(result.audit_path.read_text())
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for f in audit["flags"]:
        out[(f["split"], f["id"])].append(f)
    return out


@pytest.fixture(scope="module")
def defects(tmp_path_factory: pytest.TempPathFactory) -> ValidationResult:
    tmp = tmp_path_factory.mktemp("defects")
    return validate_gold_labels(make_defects_config(tmp), tmp / "out")


def test_each_planted_defect_caught_with_its_check(defects: ValidationResult) -> None:
    flags = _flags_by_row(defects)
    for key, (checks, _) in PLANTED.items():
        assert {f["check"] for f in flags.get(key, [])} == checks, key
    assert set(flags) <= set(PLANTED)


def test_reasons_name_the_evidence(defects: ValidationResult) -> None:
    flags = {(k, f["check"]): f for k, fs in _flags_by_row(defects).items() for f in fs}
    assert "golden_answers" in flags[(("train", "t13"), "contract")]["reason"]
    assert "question" in flags[(("train", "t17"), "contract")]["reason"]
    assert "hops" in flags[(("train", "t18"), "contract")]["reason"]
    assert "type" in flags[(("train", "t19"), "contract")]["reason"]
    assert "hops" in flags[(("test", "e5"), "contract")]["reason"]
    conflict = flags[(("train", "t4"), "conflicting_gold")]
    assert conflict["evidence"]["other"]["id"] == "t3"
    assert flags[(("train", "t7"), "leakage_exact")]["evidence"]["eval_row"]["id"] == "e1"
    near = flags[(("train", "t8"), "leakage_near")]["evidence"]
    assert near["eval_row"]["id"] == "e2" and near["jaccard"] >= 0.9
    assert flags[(("train", "t10"), "not_in_supporting")]["evidence"]["found_in"] == "p5"
    assert "Orin Tal" in flags[(("train", "t10"), "not_in_supporting")]["detail"]
    assert flags[(("train", "t11"), "unknown_supporting_doc")]["evidence"]["missing"] == ["p99"]
    assert flags[(("train", "t12"), "time_sensitive")]["evidence"]["term"] == "current"
    assert "quellandia" in flags[(("train", "t9"), "unanswerable")]["detail"]


def test_clean_plus_quarantined_equals_input(defects: ValidationResult) -> None:
    quarantined = {(q["split"], q["id"]) for q in
                   map(json.loads, defects.quarantine_path.read_text().splitlines())}
    assert quarantined == {k for k, (_, q) in PLANTED.items() if q}
    clean = {(s, ex.id) for s, p in defects.split_paths.items() for ex in read_qa(p)}
    assert clean == {k for k, (_, q) in PLANTED.items() if not q}
    counts = defects.counts
    assert counts["rows_in"] == 24 == counts["clean"] + counts["quarantined"]
    assert counts["clean"] == len(clean)
    assert all(read_manifest(p) is not None for p in defects.split_paths.values())


def test_quarantine_file_has_reason_per_row(defects: ValidationResult) -> None:
    records = [json.loads(line) for line in defects.quarantine_path.read_text().splitlines()]
    assert len(records) == defects.counts["quarantined"] > 0
    for q in records:
        assert q["reason"] and q["record"]["id"] == q["id"] and q["row"] >= 1
        planted, _ = PLANTED[(q["split"], q["id"])]
        assert planted <= {r["check"] for r in q["reasons"]}, (q["id"], q["reasons"])
        # `reason` names the checks that quarantine the row.
        assert all(f"{r['check']}: " in q["reason"] for r in q["reasons"] if r["quarantines"])
        assert any(r["quarantines"] for r in q["reasons"])


def test_report_lists_every_flagged_row_with_evidence(defects: ValidationResult) -> None:
    assert defects.report_html is not None and defects.report_md is not None
    html = defects.report_html.read_text()
    md = defects.report_md.read_text()
    assert "<script" not in html and "http" not in html  # self-contained
    for text in (html, md):
        for key, (checks, _) in PLANTED.items():
            if checks:
                assert f"{key[1]}" in text
        assert "4,200 metres" in text  # the leaked train/eval pair's gold answer
    assert "| train | 9 |" in md  # t9 quarantined with row number 9
    metrics = defects.metrics()
    assert metrics["rows_quarantined"] == 15 and metrics["check_leakage_near"] == 1


def test_steward_overrides_accept_correct_and_report(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(
        "- {id: t8, action: accept, reason: paraphrase of a public fact, steward: ana}\n"
        "- {id: t9, action: correct, golden_answers: [Quelland], reason: typo, steward: ana}\n"
        "- {id: t13, action: accept, reason: try anyway, steward: bo}\n"
        "- {id: nope, action: accept, reason: stale, steward: bo}\n")
    result = validate_gold_labels(make_defects_config(tmp_path, overrides_path=str(overrides)),
                                  tmp_path / "out")
    clean = {ex.id: ex for ex in read_qa(result.split_paths["train"])}
    assert "t8" in clean                                   # accepted despite leakage_near
    assert clean["t9"].golden_answers == ("Quelland",)     # corrected, then checked: answerable
    quarantined = {json.loads(line)["id"] for line in result.quarantine_path.read_text()
                   .splitlines()}
    assert "t13" in quarantined                            # a contract failure is not waivable
    assert result.counts["accepted"] == 1 and result.counts["corrected"] == 1
    assert result.counts["unused_overrides"] == 1
    assert result.report_md is not None
    md = result.report_md.read_text()
    assert "typo" in md and "['Quellandia'] -> ['Quelland']" in md
    assert "accept ignored" in md and "`nope`" in md


@pytest.mark.parametrize(("text", "match"), [
    ("- {id: a, action: accept, steward: x}\n", r"entry 1 \(id 'a'\): field 'reason'"),
    ("- {id: a, action: correct, reason: r, steward: x}\n", "golden_answers"),
    ("- {id: a, action: delete, reason: r, steward: x}\n", "field 'action'"),
    ("id: a\n", "expected a YAML list"),
])
def test_bad_overrides_file_names_entry_and_field(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "o.yaml"
    path.write_text(text)
    with pytest.raises(OverridesError, match=match):
        load_overrides(path)


def test_missing_overrides_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(OverridesError, match="not found"):
        load_overrides(tmp_path / "missing.yaml")


def test_threshold_fails_after_writing_report_and_no_clean_manifest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(QuarantineThresholdError, match=r"15/24 rows .*max_quarantine_fraction"):
        validate_gold_labels(make_defects_config(tmp_path, max_quarantine_fraction=0.5), out)
    assert (out / "audit_report.html").is_file() and (out / "quarantine.jsonl").is_file()
    assert not list(out.glob("*.jsonl.manifest.json"))


def test_default_synthetic_world_is_clean(tmp_path: Path) -> None:
    config = PipelineConfig.model_validate({
        "run": {"work_dir": str(tmp_path / "run")},
        "validate": {"contracts_dir": str(ROOT / "data_contracts"),
                     "overrides_path": str(ROOT / "data_contracts" / "overrides.yaml")}})
    result = validate_gold_labels(config, tmp_path / "out")
    assert result.counts["quarantined"] == 0
    assert result.counts["clean"] == result.counts["rows_in"] > 0


@pytest.mark.slow
def test_bench_runs_and_finds_planted_defects(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from searchrl.validation.bench import main

    assert main(["--rows", "400", "--passages", "2000", "--out", str(tmp_path),
                 "--contracts-dir", str(ROOT / "data_contracts")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["rows_in"] == 400
    assert report["check_counts"]["leakage_exact"] == 10  # 20 leaks planted, half exact
    assert report["check_counts"]["unanswerable"] >= 1


def test_broken_corpus_stops_the_stage_naming_file_row_field(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "p1", "contents": "Paris is in France."}\n'
                      '{"id": "p1", "contents": "Lyon is a city."}\n'
                      '{"id": "p3", "contents": "   "}\n')
    config = make_defects_config(tmp_path).model_copy(update={
        "data": make_defects_config(tmp_path).data.model_copy(
            update={"corpus_path": str(corpus)})})
    with pytest.raises(ContractError, match=r"corpus\.jsonl: row 3: contents: must not be blank"):
        validate_gold_labels(config, tmp_path / "out")
