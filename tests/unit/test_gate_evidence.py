"""Evidence a skeptic accepts (issue 33): the "without RL" comparator is the stronger of the
fine-tuned systems (sft, rejection_sampling), never a fixed program; a scripted baseline that
matches or beats the policy is said first; every system is listed side by side with its
interval; a slice under gate.slice_claim_min_questions is never a win; the report says
whether its world was sealed from tuning; and a world card says what each slice tests."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

from searchrl.config import PipelineConfig
from searchrl.datasets.reading_world import SLICE_CARD
from searchrl.eval.baselines import TRAINED
from searchrl.eval.metrics import QuestionResult, by_slices
from searchrl.eval.results import EvalResult, SystemResult
from searchrl.gate.render import ReportInputs, render_html, render_markdown
from searchrl.gate.report import (
    build_gate,
    provenance_sentence,
    write_gate_report,
)
from tests.unit.test_gate_report import _config, _eval, _train

FRONTIER_CFG = {"base_url": "http://127.0.0.1:9/v1", "model": "big",
                "price_per_1k_prompt_tokens": 0.01, "price_per_1k_completion_tokens": 0.03}
EM_CI = re.compile(r"^\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]$")


def _box(md: str) -> list[list[str]]:
    """The decision box's systems table (the first table, before any section) as cells."""
    head = md.split("\n## ")[0]
    rows = [line for line in head.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]


def _gate(tmp: Path, accs: dict[str, float], config: PipelineConfig | None = None
          ) -> ReportInputs:
    _, report = build_gate(config or _config(), _eval(tmp, accs), gold_pairs=500,
                           stages=_train(3600.0), training_curve={})
    return report


def test_the_comparator_is_the_stronger_sft_family_system_never_scripted(
        tmp_path: Path) -> None:
    # scripted and retrieve_once beat both fine-tuned systems: neither is the bar.
    accs = {"no_search": 0.1, "retrieve_once": 0.5, "scripted": 0.55, "sft": 0.3,
            "rejection_sampling": 0.4, "champion": 0.58, TRAINED: 0.6}
    report = _gate(tmp_path, accs)
    assert report.comparison_baseline == "rejection_sampling"
    assert report.comparator.startswith(
        "Comparator: best SFT-family system without RL: rejection_sampling (the stronger by "
        "EM of sft 0.300, rejection_sampling 0.400), a stand-in, NOT the frontier system")
    report = _gate(tmp_path, accs | {"sft": 0.45})
    assert report.comparison_baseline == "sft"
    md = render_markdown(report)
    assert "**Comparator: best SFT-family system without RL: sft" in md
    cells = {row[0]: row for row in _box(md)}
    assert cells["sft"][1].endswith("THE COMPARATOR")
    assert not any("COMPARATOR" in row[1] for name, row in cells.items() if name != "sft")


def test_every_system_side_by_side_in_order_with_intervals(tmp_path: Path) -> None:
    accs = {"champion": 0.55, TRAINED: 0.6, "base_agentic": 0.0, "rejection_sampling": 0.4,
            "sft": 0.3, "scripted": 0.2, "retrieve_once": 0.25, "no_search": 0.1}
    config = PipelineConfig.model_validate({
        "gate": _config().gate.model_dump() | {"allow_stand_in_comparator": False},
        "eval": {"frontier": FRONTIER_CFG}})
    md = render_markdown(_gate(tmp_path, accs, config))
    rows = _box(md)
    assert [r[0] for r in rows] == ["no_search", "retrieve_once", "scripted", "sft",
                                    "rejection_sampling", TRAINED, "champion", "base_agentic",
                                    "frontier"]
    assert ("| system | what it is | n | EM [95% CI] | trained - it [95% CI] | searches/q | "
            "format ok |") in md
    for row in rows[:-1]:
        assert EM_CI.match(row[3]), row
        assert row[5] == "1.00" and row[6] == "1.00"  # searches/q, format ok
    assert rows[2][3].startswith("0.200 [") and rows[5][3].startswith("0.600 [")
    assert rows[2][4].startswith("+0.400 [") and rows[5][4] == ""  # trained - scripted
    assert rows[-1][3] == "not evaluated (see the notes)"  # configured, not measured
    page = render_html(_gate(tmp_path, accs, config), figures={})
    assert '<div id="decision-systems"><table>' in page
    assert page.index('id="decision-systems"') < page.index('id="checks"')


def test_a_script_that_beats_the_policy_is_said_first(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {"sft": 0.3, "scripted": 0.7, TRAINED: 0.6})
    outcome = write_gate_report(_config(), ev, tmp_path / "gate", gold_pairs=500,
                                stages=_train(3600.0), metrics_path=None)
    report = outcome.report
    assert report.comparison_baseline == "sft" and report.scripted_warning
    # A gate condition, not only a warning: a policy a fixed script beats is never promoted.
    assert not outcome.result.go
    assert any(c.name == "scripted" and not c.passed for c in outcome.result.checks)
    md = outcome.md_path.read_text()
    warning = ("**WARNING: the scripted baseline (a fixed program, no learning) beats the "
               "trained policy: EM 0.700 vs trained 0.600, paired trained - scripted -0.100 [")
    assert warning in md and md.index(warning) < md.index("**Comparator:")
    # The script winning means the policy did not learn, not that the world needs no learning.
    assert "The policy did not learn to do better than a fixed program" in md
    assert "does not need learning" not in md
    page = outcome.html_path.read_text()
    assert '<p id="scripted" class="fail"><b>WARNING: the scripted baseline' in page
    assert page.index('id="scripted"') < page.index('id="comparator"')
    saved = json.loads(outcome.decision_path.read_text())
    assert saved["scripted"]["warning"] and saved["figures"][
        "scripted_matches_or_beats_trained"] == 1.0
    assert list(saved["systems"]) == ["scripted", "sft", TRAINED]
    # A tie is a warning too ("matches"); a policy clearly ahead is stated, not warned.
    assert "matches the trained policy" in _gate(tmp_path, {"sft": 0.3, "scripted": 0.6,
                                                           TRAINED: 0.6}).scripted
    ahead = _gate(tmp_path, {"sft": 0.3, "scripted": 0.2, TRAINED: 0.6})
    assert not ahead.scripted_warning and "beats the fixed program" in ahead.scripted
    assert "not evaluated" in _gate(tmp_path, {"sft": 0.3, TRAINED: 0.6}).scripted


def _sliced() -> dict[str, list[QuestionResult]]:
    """80 questions: `comparison` q0-39 (trained 40/40, rejection_sampling 20/40, sft
    10/40), `alias` q40-49 (trained 10/10, the others 0/10: an interval above 0 on 10
    questions), `unseen_phrasing` every even question; q50-79 nobody answers."""
    def slices(i: int) -> tuple[str, ...]:
        named = ("comparison",) if i < 40 else ("alias",) if i < 50 else ()
        return named + ("unseen_phrasing",) * (i % 2 == 0)

    right: dict[str, Callable[[int], bool]] = {
        TRAINED: lambda i: i < 50, "rejection_sampling": lambda i: i < 40 and i % 2 == 0,
        "sft": lambda i: i < 40 and i % 4 == 0}
    return {name: [QuestionResult(
        example_id=f"q{i}", hops=2, qtype="compare_org_founded" if i < 40 else "org_founder",
        em=float(ok(i)), f1=float(ok(i)), searches=2, format_ok=True, prompt_tokens=80,
        response_tokens=20, latency_s=0.01, answered=True, finish_reason="answer",
        slices=slices(i)) for i in range(80)] for name, ok in right.items()}


def test_a_slice_under_the_claim_minimum_is_never_a_win(tmp_path: Path) -> None:
    ev = _eval(tmp_path, {}, _sliced())
    _, report = build_gate(_config(), ev, gold_pairs=500, stages=_train(3600.0),
                           training_curve={})
    assert report.comparison_baseline == "rejection_sampling"
    assert report.slices is not None and report.slices.claim_min_questions == 30
    by = {s.label: s for s in report.slices.slices}
    alias = by["slice alias"]
    assert alias.n == 10 and alias.too_few_to_claim and not alias.wins
    assert alias.vs[0].delta.lo > 0.0  # above 0, still no win: 10 questions
    assert [d.against for d in by["slice comparison"].wins] == ["rejection_sampling"]
    assert by["slice unseen_phrasing"].n == 40
    md = render_markdown(report)
    assert ("| slice alias | 10 | 1.000 [1.000, 1.000] (10/10) | 0.000 | +1.000 [+1.000, "
            "+1.000] (n=10) | too few to claim (n < 30) |") in md
    assert ("| slice comparison | 40 | 1.000 [1.000, 1.000] (40/40) | 0.500 | +0.500 "
            "[") in md
    assert "(n=40) | win vs rejection_sampling |" in md
    # Raising the bar above every slice leaves no win anywhere.
    _, strict = build_gate(_config(slice_claim_min_questions=81), ev, gold_pairs=500,
                           stages=_train(3600.0), training_curve={})
    assert strict.slices is not None and not strict.slices.wins
    strict_md = render_markdown(strict)
    assert "win vs" not in strict_md and "too few to claim (n < 81)" in strict_md


def test_the_world_card_names_each_slice_with_its_questions(tmp_path: Path) -> None:
    per = _sliced()
    ev = _eval(tmp_path, {}, per)
    _, report = build_gate(_config(), ev, gold_pairs=500, stages=_train(3600.0),
                           training_curve={})
    # Without a recorded breakdown (an older results.json): counts from the slice report,
    # descriptions from the world's SLICE_CARD.
    assert report.world_card == (("alias", 10, SLICE_CARD["alias"]),
                                 ("comparison", 40, SLICE_CARD["comparison"]),
                                 ("unseen_phrasing", 40, SLICE_CARD["unseen_phrasing"]))
    md = render_markdown(report)
    assert "## World card: what each named slice of the eval questions tests" in md
    assert f"| comparison | 40 | {SLICE_CARD['comparison']} |" in md
    # What the evaluation recorded comes first; a slice nobody described says so.
    trained = dataclasses.replace(ev.systems[TRAINED], by_slice={
        **by_slices(per[TRAINED], samples=20), "mystery": by_slices(per[TRAINED][:3],
                                                                    samples=20)["comparison"]})
    recorded = dataclasses.replace(ev, systems=ev.systems | {TRAINED: trained},
                                   slice_card={"comparison": "two years compared"})
    _, report = build_gate(_config(), recorded, gold_pairs=500, stages=_train(3600.0),
                           training_curve={})
    card = {name: (n, text) for name, n, text in report.world_card}
    assert card["comparison"] == (40, "two years compared")
    assert card["alias"] == (10, SLICE_CARD["alias"])
    assert card["mystery"] == (3, "not described (no slice card recorded)")


def test_sealed_world_or_a_labelled_caveat() -> None:
    def sentence(**data: object) -> tuple[str, bool]:
        config: PipelineConfig = PipelineConfig.model_validate({"data": data})
        return provenance_sentence(config)

    text, sealed = sentence(synthetic={"seed": 13, "tuning_seeds": [21, 22]})
    assert sealed and text == (
        "How the recipe was chosen: hyperparameters chosen on the dev splits of worlds 21, 22 "
        "(data.synthetic.tuning_seeds); this report's world (seed 13) is sealed: no tuning "
        "read it.")
    text, sealed = sentence(synthetic={"seed": 21, "tuning_seeds": [21, 22]})
    assert not sealed and "CAVEAT: this world (seed 21) was used for tuning" in text
    assert text.endswith("not a sealed result.")
    text, sealed = sentence(synthetic={"seed": 13})
    assert not sealed and "CAVEAT: tuning provenance not recorded" in text
    assert text.endswith("not a sealed result.")
    text, sealed = sentence(source="files", train_path="a", test_path="b", corpus_path="c")
    assert not sealed and "tuning provenance not recorded for data.source=files" in text


def test_the_provenance_is_in_the_decision_box(tmp_path: Path) -> None:
    sealed = PipelineConfig.model_validate({
        "gate": _config().gate.model_dump(),
        "data": {"synthetic": {"seed": 13, "tuning_seeds": [21]}}})
    report = _gate(tmp_path, {"sft": 0.3, TRAINED: 0.6}, sealed)
    md, page = render_markdown(report), render_html(report, figures={})
    head = md.split("\n## ")[0]
    assert "**How the recipe was chosen: hyperparameters chosen on the dev splits of worlds " \
           "21" in head
    assert '<p id="provenance"><b>How the recipe was chosen' in page
    caveat = _gate(tmp_path, {"sft": 0.3, TRAINED: 0.6})  # tuning_seeds empty
    assert '<p id="provenance" class="fail"><b>How the recipe was chosen: CAVEAT' in \
        render_html(caveat, figures={})


def test_slices_are_recorded_and_round_trip() -> None:
    per = _sliced()[TRAINED]
    r = per[0]
    assert QuestionResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    old = {k: v for k, v in r.to_dict().items() if k != "slices"}  # a file from before
    assert QuestionResult.from_dict(old).slices == ()
    groups = by_slices(per, samples=20)
    assert list(groups) == ["alias", "comparison", "unseen_phrasing"]
    assert (groups["alias"].n, groups["comparison"].n, groups["unseen_phrasing"].n) == (
        10, 40, 40)  # overlapping: q0 is in comparison and unseen_phrasing
    assert groups["alias"].em.mean == 1.0 and groups["unseen_phrasing"].em.mean == 25 / 40


def test_results_json_keeps_the_slice_breakdown_and_card(tmp_path: Path) -> None:
    per = _sliced()
    ev = _eval(tmp_path, {}, per)
    trained = dataclasses.replace(ev.systems[TRAINED], by_slice=by_slices(per[TRAINED],
                                                                           samples=20))
    ev = dataclasses.replace(ev, systems=ev.systems | {TRAINED: trained},
                             slice_card={"alias": SLICE_CARD["alias"]})
    back = EvalResult.from_dict(json.loads(json.dumps(ev.to_dict())))
    def dump(system: SystemResult) -> str:  # NaN != NaN: compare the JSON
        return json.dumps({k: v.to_dict() for k, v in system.by_slice.items()})

    assert dump(back.systems[TRAINED]) == dump(trained) and '"alias"' in dump(trained)
    assert back.slice_card == {"alias": SLICE_CARD["alias"]}
    assert back.systems["sft"].by_slice == {}


def test_gate_says_no_go_when_the_trained_policy_does_not_beat_the_script() -> None:
    from searchrl.gate.payback import CostInputs, GateInputs, GateThresholds, decide

    costs = CostInputs(gpu_type="cpu", training_gpu_hours=1.0, gpu_price_per_hour=1.0,
                       production_queries_per_month=1e6, small_tokens_per_query=100,
                       small_price_per_1k_tokens=0.0001, frontier_tokens_per_query=1000,
                       frontier_price_per_1k_tokens=0.01)
    thresholds = GateThresholds(min_gold_pairs=1, min_accuracy_margin=0.0,
                                max_payback_months=6.0, champion_margin=0.02)

    def run(scripted: tuple[float, float, float] | None) -> tuple[bool, str]:
        result = decide(GateInputs(gold_pairs=10, accuracy_delta=0.2, accuracy_delta_lo=0.1,
                                   accuracy_delta_hi=0.3, comparison_baseline="sft",
                                   costs=costs, allow_stand_in=True,
                                   scripted_delta=scripted), thresholds)
        check = next(c for c in result.checks if c.name == "scripted")
        return result.go, check.detail

    go, detail = run((-0.2, -0.25, -0.15))
    assert not go and "does not beat a fixed script" in detail
    assert not run((0.02, -0.01, 0.05))[0]  # indistinguishable from the script: no GO
    assert run((0.1, 0.05, 0.15))[0]
    go, detail = run(None)
    assert go and "not evaluated" in detail
