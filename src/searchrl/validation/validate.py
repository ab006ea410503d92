"""Stage 1 library entry: materialise the sources, check every QA row, quarantine what fails,
write the data steward's audit report.

Order of work (each step's output feeds the next; nothing downstream sees an unchecked row):

1. materialise the QA sources (`<out_dir>/source/`), load the steward overrides; a QA line
   that is not a JSON object becomes a `parse` flag on that file and line (the rest
   validates); a file unreadable as a whole stops the stage with a one-line DataError naming
   it;
2. QA splits: steward corrections applied, then the `gold_qa` (train) or `eval_set` (dev, test,
   extra eval) suite + row schema: failures are per-row `contract`/`duplicate_id`/`schema` flags;
   rows keep their source file and row number (the line, for JSONL);
3. corpora, streamed once each (`searchrl.validation.corpus`: memory flat in corpus size): copied
   into `source/`, the `corpus` GX suite + row schema chunk by chunk (ids unique over the whole
   file; on `engine.local_workers` processes for a large corpus), and the answer scan for
   step 4 on the way; a broken passage stops the stage;
4. checks beyond the schema (`searchrl.validation.checks`) on every row that parses as a
   `QAExample`, contract failures included (they are quarantined anyway, but their leakage and
   answer variants are still reported); train rows without usable gold still get the leakage
   checks;
5. decide: a flag whose check is in `validate.quarantine_checks` quarantines its row unless a
   steward accepted it (`parse`/`contract`/`schema`/`duplicate_id` always quarantine and
   cannot be accepted); every other flag is shown for review;
6. write `quarantine.jsonl`, `audit.json`, `audit_report.{md,html}`; check clean + quarantined
   = input; fail with `QuarantineThresholdError` when the quarantined share passes
   `validate.max_quarantine_fraction` (the report is written first, so the steward can act);
7. write the clean splits as `<split>.jsonl` with manifests (only on success).

Over 400 lines because the seven steps above are one ordered pass, each feeding the next.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from searchrl.config import PipelineConfig, ValidateConfig
from searchrl.datasets.io import (
    BadRow,
    atomic_write_text,
    manifest_path,
    read_raw_qa_rows,
    write_jsonl,
)
from searchrl.datasets.sources import (
    SourcePaths,
    SourceRows,
    extra_eval_split,
    materialise_sources,
)
from searchrl.paths import safe_filename
from searchrl.types import QAExample
from searchrl.validation.answerability import AnswerScan
from searchrl.validation.checks import (
    CheckedRow,
    CorpusFacts,
    Flag,
    answer_variant_flags,
    answerability_flags_from,
    answers_to_find,
    leakage_flags,
    near_duplicate_leakage_flags,
    question_group_flags,
    supporting_ids,
    time_sensitive_flags,
)
from searchrl.validation.corpus import check_corpora, chunk_workers
from searchrl.validation.drift import (
    DIGEST_DIR,
    DriftReport,
    GoldDigest,
    compare,
    history_dir,
    keep_digest,
    reference_digest,
)
from searchrl.validation.overrides import AppliedOverride, Override, load_overrides
from searchrl.validation.report import (
    Audit,
    RowOutcome,
    check_row_counts,
    render_html,
    render_markdown,
)
from searchrl.validation.suites import SuiteResult, SuiteRunner

# A row failing these cannot be used as it stands; a steward corrects the source instead. They
# quarantine whatever `validate.quarantine_checks` lists: such a row is never clean.
UNWAIVABLE = frozenset({"parse", "contract", "schema", "duplicate_id"})


class QuarantineThresholdError(RuntimeError):
    """Too large a share of rows failed validation for the run to go on.

    `report_paths` are the audit report files (already written) for the steward."""

    def __init__(self, message: str, report_paths: tuple[Path, ...] = ()) -> None:
        super().__init__(message)
        self.report_paths = report_paths


class ValidationInvariantError(AssertionError):
    """clean + quarantined != input: a row was lost or counted twice (a bug, never data)."""


@dataclass
class ValidationResult:
    out_dir: Path
    split_paths: dict[str, Path]  # train/dev/test -> clean file
    corpus_path: Path
    quarantine_path: Path
    extra_evals: dict[str, Path] = field(default_factory=dict)  # name -> clean file
    extra_corpora: dict[str, Path] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    quarantined: list[dict[str, Any]] = field(default_factory=list)
    report_html: Path | None = None
    report_md: Path | None = None
    audit_path: Path | None = None
    check_counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    drift: DriftReport | None = None
    digest_dir: Path | None = None

    def metrics(self) -> dict[str, float]:
        """Flat metrics for the stage's MLflow run."""
        c = self.counts
        out: dict[str, float] = {
            "rows_in": c["rows_in"], "rows_clean": c["clean"],
            "rows_quarantined": c["quarantined"], "rows_review": c["review"],
            "quarantine_fraction": c["quarantined"] / max(c["rows_in"], 1),
            "overrides_accepted": c["accepted"], "overrides_corrected": c["corrected"],
            "overrides_unused": c["unused_overrides"], "validation_seconds": self.seconds,
        }
        out |= {f"check_{k}": v for k, v in sorted(self.check_counts.items())}
        if self.drift is not None:
            out |= self.drift.metrics()
        return out


def _apply_corrections(split: str, rows: list[tuple[int, dict[str, Any]]],
                       overrides: list[Override], used: set[int]
                       ) -> dict[int, list[AppliedOverride]]:
    """Replace gold answers where a steward corrected them (in place); row -> applied."""
    applied: dict[int, list[AppliedOverride]] = defaultdict(list)
    for k, o in enumerate(overrides):
        if o.action != "correct" or o.golden_answers is None:
            continue
        for i, (rowno, raw) in enumerate(rows):
            if o.matches(split, None if raw.get("id") is None else str(raw.get("id"))):
                previous = raw.get("golden_answers")
                prev = tuple(str(a) for a in previous) if isinstance(previous, list | tuple) \
                    else None
                rows[i] = (rowno, {**raw, "golden_answers": list(o.golden_answers)})
                applied[rowno].append(AppliedOverride(
                    o, split, rowno, prev, f"gold answers {list(prev or ())} -> "
                                           f"{list(o.golden_answers)}"))
                used.add(k)
    return applied


def _leakage_proxy(rowno: int, raw: dict[str, Any]) -> QAExample | None:
    """The question of a row that does not parse as a QAExample (no usable gold), for the
    leakage checks alone; None without a question to compare."""
    question = raw.get("question")
    if not isinstance(question, str) or not question.strip():
        return None
    answers = raw.get("golden_answers")
    golds = tuple(a for a in answers if isinstance(a, str)) if isinstance(answers, list) else ()
    row_id = raw.get("id")
    return QAExample.model_construct(
        id=str(row_id) if row_id is not None else f"row {rowno}", question=question,
        golden_answers=golds, hops=None, type=None, supporting_doc_ids=())


def _contract_flags(split: str, rows: list[tuple[int, dict[str, Any]]], result: SuiteResult,
                    schema: Any
                    ) -> tuple[dict[int, list[Flag]], dict[int, QAExample], dict[int, QAExample]]:
    """Per row: contract/duplicate_id/schema flags; the parsed example of every row that
    parses as a QAExample, flagged or not; a leakage proxy for the rest with a question."""
    ids: dict[str, list[int]] = defaultdict(list)
    for rowno, raw in rows:
        if isinstance(raw.get("id"), str):
            ids[raw["id"]].append(rowno)
    flags: dict[int, list[Flag]] = defaultdict(list)
    parsed: dict[int, QAExample] = {}
    proxies: dict[int, QAExample] = {}
    for i, (rowno, raw) in enumerate(rows):
        row_id = raw.get("id") if isinstance(raw.get("id"), str) else None
        for check, reason in result.row_failures.get(i, []):
            if check == "duplicate_id":
                others = [r for r in ids.get(row_id or "", []) if r != rowno]
                flags[rowno].append(Flag(split, rowno, row_id, check, reason,
                                         f"same id at rows {others}", {"other_rows": others}))
            else:
                flags[rowno].append(Flag(split, rowno, row_id, check, reason))
        try:
            schema.model_validate(raw)
        except ValidationError as exc:
            if not flags[rowno]:  # the suite passed this row: the two contracts disagree
                first = exc.errors()[0]
                flags[rowno].append(Flag(
                    split, rowno, row_id, "schema",
                    f"{'.'.join(map(str, first['loc']))}: {first['msg']}"))
        try:
            parsed[rowno] = QAExample.model_validate(raw)
        except ValidationError:
            proxy = _leakage_proxy(rowno, raw)
            if proxy is not None:
                proxies[rowno] = proxy
    return flags, parsed, proxies


def _parse_outcome(split: str, bad: BadRow) -> RowOutcome:
    """A line that is not a JSON object: quarantined with its file, line and parse error."""
    return RowOutcome(split, bad.source, bad.line, {}, [Flag(
        split, bad.line, None, "parse", f"{bad.source}:{bad.line}: {bad.error}",
        f"line {bad.line}: {bad.text!r}",
        {"file": bad.source, "line": bad.line, "error": bad.error, "text": bad.text})])


def _quarantines(check: str, cfg: ValidateConfig) -> bool:
    return check in cfg.quarantine_checks or check in UNWAIVABLE


def _decide(outcome: RowOutcome, cfg: ValidateConfig, overrides: list[Override],
            used: set[int]) -> None:
    blocking = [f for f in outcome.flags if _quarantines(f.check, cfg)]
    for k, o in enumerate(overrides):
        if o.action != "accept" or not o.matches(outcome.split, outcome.id):
            continue
        used.add(k)
        unwaivable = sorted({f.check for f in blocking if f.check in UNWAIVABLE})
        if unwaivable:
            effect = f"accept ignored: {unwaivable} cannot be accepted, correct the source row"
        elif blocking:
            effect = f"accepted despite {sorted({f.check for f in blocking})}"
            blocking = []
        else:
            effect = "accept had no effect: the row is not quarantined"
        outcome.overrides.append(AppliedOverride(o, outcome.split, outcome.row, None, effect))
    outcome.quarantined = bool(blocking)


def _quarantine_record(o: RowOutcome, cfg: ValidateConfig) -> dict[str, Any]:
    blocking = [f for f in o.flags if _quarantines(f.check, cfg)]
    return {
        "split": o.split, "file": o.file, "row": o.row, "id": o.id,
        "reason": "; ".join(f"{f.check}: {f.reason}" for f in blocking),
        "reasons": [{"check": f.check, "reason": f.reason, "detail": f.detail,
                     "evidence": f.evidence, "quarantines": _quarantines(f.check, cfg)}
                    for f in o.flags],
        "overrides": [{"action": a.override.action, "steward": a.override.steward,
                       "reason": a.override.reason, "effect": a.effect} for a in o.overrides],
        "record": o.record,
    }


def _check_invariant(outcomes: list[RowOutcome], rows_in: dict[str, int],
                     clean: dict[str, list[QAExample]]) -> None:
    seen: set[tuple[str, int]] = set()
    for o in outcomes:
        if (o.split, o.row) in seen:
            raise ValidationInvariantError(f"{o.split} row {o.row} decided twice")
        seen.add((o.split, o.row))
    for split, n in rows_in.items():
        n_clean = len(clean.get(split, []))
        n_quar = sum(1 for o in outcomes if o.split == split and o.quarantined)
        n_out = sum(1 for o in outcomes if o.split == split)
        if n_clean + n_quar != n or n_out != n:
            raise ValidationInvariantError(
                f"{split}: clean {n_clean} + quarantined {n_quar} != input {n} rows")


@dataclass
class _QAChecked:
    """Every QA row's outcome after the contracts, and the rows the later checks see."""

    outcomes: list[RowOutcome] = field(default_factory=list)
    sound: list[CheckedRow] = field(default_factory=list)  # parse and pass the contract
    broken: list[CheckedRow] = field(default_factory=list)  # parse, break the contract
    proxies: list[CheckedRow] = field(default_factory=list)  # train rows without usable gold
    rows_in: dict[str, int] = field(default_factory=dict)
    suites: list[SuiteResult] = field(default_factory=list)


def _source_rows(name: str, path: Path, provenance: SourceRows
                 ) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """The steward's file and its rows numbered as there (not as in our copy)."""
    rows = read_raw_qa_rows(path)  # our own copy: every line is a JSON object
    file = provenance.files.get(name, str(path))
    if name in provenance.rows:
        source_rows = provenance.rows[name]
        if len(source_rows) != len(rows):
            raise ValidationInvariantError(f"{path}: {len(rows)} rows copied from {file}, "
                                           f"which has {len(source_rows)}")
        rows = [(rowno, raw) for rowno, (_, raw) in zip(source_rows, rows, strict=True)]
    return file, rows


def _check_qa_sets(runner: SuiteRunner, sources: SourcePaths, provenance: SourceRows,
                   overrides: list[Override], used: set[int]) -> _QAChecked:
    """Per QA set: steward corrections, then its suite and row schema, row by row."""
    out = _QAChecked()
    for name, path in sources.qa_sets().items():
        file, rows = _source_rows(name, path, provenance)
        unreadable = provenance.unreadable.get(name, [])
        out.rows_in[name] = len(rows) + len(unreadable)
        corrected = _apply_corrections(name, rows, overrides, used)
        suite = "gold_qa" if name == "train" else "eval_set"
        result = runner.run(suite, name, [raw for _, raw in rows])
        out.suites.append(result)
        flags, parsed, leak_only = _contract_flags(name, rows, result, runner.row_schema(suite))
        for rowno, raw in rows:
            out.outcomes.append(RowOutcome(name, file, rowno, raw, list(flags.get(rowno, [])),
                                           overrides=list(corrected.get(rowno, []))))
            if rowno in parsed:
                (out.broken if flags.get(rowno) else out.sound).append(
                    CheckedRow(name, rowno, parsed[rowno]))
            elif rowno in leak_only and name == "train":
                out.proxies.append(CheckedRow(name, rowno, leak_only[rowno]))
        out.outcomes.extend(_parse_outcome(name, bad) for bad in unreadable)
    return out


def _flag_beyond_schema(qa: _QAChecked, facts: CorpusFacts, cfg: ValidateConfig) -> None:
    """The checks beyond the schema, on contract-broken rows too (after the sound ones, so a
    duplicate_question lands on the broken copy and the sound "first occurrence" is kept);
    their flags join the rows' outcomes."""
    checked = qa.sound + qa.broken
    evals = [c for c in checked if c.split != "train"]
    extra = (answer_variant_flags(checked) + question_group_flags(checked)
             + near_duplicate_leakage_flags(checked, cfg.near_duplicate_threshold)
             + time_sensitive_flags(checked, cfg.time_sensitive_terms)
             + answerability_flags_from(checked, facts, cfg.non_extractive_answers)
             + (leakage_flags(qa.proxies + evals, cfg.near_duplicate_threshold)
                if qa.proxies else []))
    by_row = {(o.split, o.row): o for o in qa.outcomes}
    for f in extra:
        by_row[(f.split, f.row)].flags.append(f)


def _corpus_facts(qa: _QAChecked, cfg: ValidateConfig) -> CorpusFacts:
    """What the corpus pass gathers for the answerability checks: the answers and supporting
    passages of the rows `_flag_beyond_schema` checks."""
    checked = qa.sound + qa.broken
    return CorpusFacts(AnswerScan(answers_to_find(checked, cfg.non_extractive_answers)),
                       supporting_ids(checked))


def _decide_rows(qa: _QAChecked, cfg: ValidateConfig, overrides: list[Override],
                 used: set[int]) -> dict[str, list[QAExample]]:
    """Quarantine or keep every row; the clean examples per split (invariant checked)."""
    for o in qa.outcomes:
        _decide(o, cfg, overrides, used)
    quarantined = {(o.split, o.row) for o in qa.outcomes if o.quarantined}
    clean: dict[str, list[QAExample]] = defaultdict(list)
    for c in qa.sound:
        if (c.split, c.row) not in quarantined:
            clean[c.split].append(c.example)
    _check_invariant(qa.outcomes, qa.rows_in, clean)
    return clean


def _counts(outcomes: list[RowOutcome], rows_in: dict[str, int],
            clean: dict[str, list[QAExample]], n_overrides: int, n_used: int
            ) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Totals and per-split counts for the metrics and the report."""
    counts = {
        "rows_in": sum(rows_in.values()),
        "clean": sum(len(v) for v in clean.values()),
        "quarantined": sum(o.quarantined for o in outcomes),
        "review": sum(1 for o in outcomes if not o.quarantined and o.flags),
        "accepted": sum(1 for o in outcomes if o.status == "accepted by steward"),
        "corrected": sum(1 for o in outcomes
                         if any(a.override.action == "correct" for a in o.overrides)),
        "unused_overrides": n_overrides - n_used,
    }
    split_counts = {
        s: {"rows_in": n, "clean": len(clean.get(s, [])),
            "quarantined": sum(1 for o in outcomes if o.split == s and o.quarantined),
            "review": sum(1 for o in outcomes if o.split == s and not o.quarantined and o.flags)}
        for s, n in rows_in.items()}
    return counts, split_counts


@dataclass
class _Written:
    quarantined: list[dict[str, Any]]
    quarantine_path: Path
    report_md: Path
    report_html: Path
    audit_path: Path
    check_counts: dict[str, int]
    quarantine_fraction: float


def _write_audit(config: PipelineConfig, out_dir: Path, qa: _QAChecked, suites: list[SuiteResult],
                 counts: dict[str, int], split_counts: dict[str, dict[str, int]],
                 overrides: list[Override], used: set[int],
                 drift: DriftReport | None = None) -> _Written:
    """quarantine.jsonl, audit_report.{md,html} and audit.json."""
    cfg = config.validate_
    outcomes = qa.outcomes
    check_counts = check_row_counts(outcomes)
    quarantined = [_quarantine_record(o, cfg) for o in outcomes if o.quarantined]
    quarantine_path = out_dir / "quarantine.jsonl"
    atomic_write_text(quarantine_path, "".join(json.dumps(q, default=str, ensure_ascii=False)
                                               + "\n" for q in quarantined))
    audit = Audit(
        title=f"Gold-label audit: {config.run.name}", counts=counts, split_counts=split_counts,
        check_rows=check_counts,
        quarantine_checks=(*cfg.quarantine_checks,
                           *sorted(UNWAIVABLE - set(cfg.quarantine_checks))),
        max_quarantine_fraction=cfg.max_quarantine_fraction, suites=suites, outcomes=outcomes,
        unused_overrides=[o for k, o in enumerate(overrides) if k not in used],
        notes=[f"Overrides file: {cfg.overrides_path}" if cfg.overrides_path else
               "No overrides file configured."], drift=drift)
    report_md, report_html = out_dir / "audit_report.md", out_dir / "audit_report.html"
    audit_path = out_dir / "audit.json"
    atomic_write_text(report_md, render_markdown(audit))
    atomic_write_text(report_html, render_html(audit))
    atomic_write_text(audit_path, json.dumps({
        "counts": counts, "split_counts": split_counts, "check_counts": check_counts,
        "flags": [asdict(f) for o in outcomes for f in o.flags],
        "suites": [{"suite": s.suite, "dataset": s.dataset, "rows": s.rows,
                    "outcomes": [asdict(x) for x in s.outcomes]} for s in suites],
        "drift": None if drift is None else asdict(drift) | {"warnings": drift.warnings},
    }, indent=1, default=str, ensure_ascii=False))
    return _Written(quarantined, quarantine_path, report_md, report_html, audit_path,
                    check_counts, audit.quarantine_fraction)


def _write_clean(out_dir: Path, names: list[str],
                 clean: dict[str, list[QAExample]]) -> dict[str, Path]:
    """Each QA set's clean rows as `<out_dir>/<split>.jsonl` (manifests last: complete now)."""
    paths: dict[str, Path] = {}
    for name in names:
        paths[name] = out_dir / f"{safe_filename(name)}.jsonl"  # extra_eval:<n> -> extra_eval_<n>
        write_jsonl(paths[name], clean.get(name, []))
        if not manifest_path(paths[name]).is_file():
            raise ValidationInvariantError(f"{paths[name]}: manifest missing after write")
    return paths


def validate_gold_labels(config: PipelineConfig, out_dir: Path) -> ValidationResult:
    """Validate every QA split and corpus; write clean splits, quarantine and audit report.

    Returns the clean split and extra eval set paths (`<out_dir>/<split>.jsonl`, ':' in split
    names as '_'), the corpus paths and the report paths. Raises DataError (a source file
    unreadable as a whole; one line naming it), ContractError (a corpus breaks its contract,
    or a suite module is broken), OverridesError (bad overrides file) or
    QuarantineThresholdError (after writing quarantine and report; no clean split is then
    marked complete).
    """
    cfg = config.validate_
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.jsonl.manifest.json"):  # an earlier run's outputs: not ours
        old.unlink()
    overrides = load_overrides(cfg.overrides_path)
    provenance = SourceRows()
    sources = materialise_sources(config.data, out_dir / "source", provenance=provenance,
                                  copy_corpora=False)
    runner = SuiteRunner(cfg.contracts_dir, cfg)
    used: set[int] = set()
    digest = GoldDigest()
    with chunk_workers(config.engine, runner, sources) as workers:  # a large corpus only
        qa = _check_qa_sets(runner, sources, provenance, overrides, used)
        facts = _corpus_facts(qa, cfg)
        corpus_suites = check_corpora(runner, sources, facts, digest, workers)
    _flag_beyond_schema(qa, facts, cfg)
    clean = _decide_rows(qa, cfg, overrides, used)
    for name, rows in clean.items():
        digest.add_qa(name, rows)
    reference = reference_digest(config.run.work_dir)
    drift = compare(digest, *reference, cfg.drift_warn_fraction) if reference else None
    counts, split_counts = _counts(qa.outcomes, qa.rows_in, clean, len(overrides), len(used))
    written = _write_audit(config, out_dir, qa, corpus_suites + qa.suites, counts,
                           split_counts, overrides, used, drift)
    share = written.quarantine_fraction
    if share > cfg.max_quarantine_fraction:
        raise QuarantineThresholdError(
            f"{counts['quarantined']}/{counts['rows_in']} rows ({share:.1%}) quarantined, above "
            f"validate.max_quarantine_fraction={cfg.max_quarantine_fraction}; see "
            f"{written.report_html} and {written.quarantine_path}; fix the data or record "
            "steward decisions in "
            + (str(cfg.overrides_path) if cfg.overrides_path else "validate.overrides_path"),
            (written.report_md, written.report_html, written.quarantine_path))
    clean_paths = _write_clean(out_dir, list(qa.rows_in), clean)
    digest_dir = digest.write(out_dir / DIGEST_DIR, {"run": config.run.name, "counts": counts})
    keep_digest(digest_dir, history_dir(config.run.work_dir) / "last")
    return ValidationResult(
        out_dir=out_dir, split_paths={s: clean_paths[s] for s in sources.splits},
        corpus_path=sources.corpus,
        extra_evals={n: clean_paths[extra_eval_split(n)] for n in sources.extra_evals},
        extra_corpora=dict(sources.extra_corpora),
        quarantine_path=written.quarantine_path, counts=counts,
        quarantined=written.quarantined, report_html=written.report_html,
        report_md=written.report_md, audit_path=written.audit_path,
        check_counts=written.check_counts, seconds=time.perf_counter() - started,
        drift=drift, digest_dir=digest_dir)
