"""Rewards: EM/F1, format score and the shaped combination."""

from __future__ import annotations

import pytest

from searchrl.config import RewardConfig
from searchrl.rl.rewards import (
    exact_match,
    f1,
    format_score,
    is_correct,
    score,
)

GOOD = "<think> look </think><search> q </search><think> so </think><answer> Tornis </answer>"


def test_exact_match_over_gold_variants_and_empty() -> None:
    assert exact_match("the tornis.", ["Veskia", "Tornis"]) == 1.0
    assert exact_match("Tornis city", ["Tornis"]) == 0.0
    assert exact_match("", ["The"]) == 0.0  # empty never matches, even a gold that normalises away
    assert exact_match("   ", ["Tornis"]) == 0.0


def test_f1_is_token_overlap_max_over_golds() -> None:
    assert f1("Tornis city", ["Tornis"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1("new tornis", ["old tornis", "new tornis"]) == 1.0
    assert f1("", ["Tornis"]) == 0.0
    assert f1("Veskia", ["Tornis"]) == 0.0


@pytest.mark.parametrize(("text", "ok"), [
    (GOOD, True),
    ("<answer> Tornis </answer>", True),
    ("  <think>a</think>\n<answer>b</answer>\n", True),
    ("<think>a</think><think>b</think><answer>c</answer>", False),  # two thinks in a row
    ("<search> q </search>", False),  # no answer
    ("<answer>a</answer><answer>b</answer>", False),  # several answers
    ("<answer>a</answer><search>q</search>", False),  # answer not last
    ("stray text <answer>a</answer>", False),
    ("<answer>a</answer> trailing", False),
    ("<think>a<search>q</search></think><answer>b</answer>", False),  # nested
    ("<think>a</think><information>x</information><answer>b</answer>", False),
    ("<search>  </search><answer>b</answer>", False),  # empty query
    ("<answer>a", False),  # unterminated
    ("</answer>", False),
    ("", False),
])
def test_format_score(text: str, ok: bool) -> None:
    assert format_score(text) == float(ok)


def test_score_combines_as_configured() -> None:
    cfg = RewardConfig(format_weight=0.2, correct_bad_format=0.7, search_cost=0.05)
    assert score(GOOD, ["Tornis"], 1, cfg).total == pytest.approx(1.0 - 0.05)
    wrong = GOOD.replace("Tornis", "Veskia")
    assert score(wrong, ["Tornis"], 1, cfg).total == pytest.approx(0.2 - 0.05)
    bad_format = "I think <answer> Tornis </answer>"
    parts = score(bad_format, ["Tornis"], 0, cfg)
    assert (parts.total, parts.em, parts.format) == (pytest.approx(0.7), 1.0, 0.0)
    assert score("no answer at all", ["Tornis"], 3, cfg).total == pytest.approx(-0.15)
    forced = score("<answer> Tornis </answer>", ["Tornis"], 2, cfg, forced_answer=True)
    assert forced.format == 0.0 and forced.total == pytest.approx(0.7 - 0.1)


def test_search_cost_on_correct_answers_only_never_ranks_wrong_above_right() -> None:
    cfg = RewardConfig(format_weight=0.0, search_cost=0.05, search_cost_applies_to="correct")
    wrong = GOOD.replace("Tornis", "Veskia")
    assert score(GOOD, ["Tornis"], 3, cfg).total == pytest.approx(1.0 - 0.15)
    assert score(GOOD, ["Tornis"], 1, cfg).total == pytest.approx(1.0 - 0.05)
    # Wrong answers pay nothing, however many searches: searching less is no way out.
    assert score(wrong, ["Tornis"], 4, cfg).total == 0.0
    assert score(wrong, ["Tornis"], 0, cfg).total == 0.0
    f1_cfg = cfg.model_copy(update={"kind": "f1"})
    partial = GOOD.replace("Tornis", "Tornis city")
    graded = f1("Tornis city", ["Tornis"])
    assert score(partial, ["Tornis"], 2, f1_cfg).total == pytest.approx(graded * (1 - 0.1))


def test_f1_kind_grades_partial_answers() -> None:
    text = "<answer> Tornis city </answer>"
    em_parts = score(text, ["Tornis"], 0, RewardConfig(kind="em", format_weight=0.0))
    f1_parts = score(text, ["Tornis"], 0, RewardConfig(kind="f1", format_weight=0.0))
    assert em_parts.total == 0.0
    assert f1_parts.total == pytest.approx(f1("Tornis city", ["Tornis"]))


def test_is_correct_is_binary_em_of_the_last_answer() -> None:
    assert is_correct(GOOD, ["tornis"])
    assert not is_correct("<answer> Tornis </answer><answer> Veskia </answer>", ["Tornis"])
    assert not is_correct("Tornis", ["Tornis"])  # no answer tag
    assert not is_correct("<answer></answer>", ["Tornis"])


def test_reward_config_rejects_out_of_range_weights() -> None:
    with pytest.raises(ValueError, match="format_weight"):
        RewardConfig(format_weight=1.5)
    with pytest.raises(ValueError, match="search_cost"):
        RewardConfig(search_cost=-0.1)
