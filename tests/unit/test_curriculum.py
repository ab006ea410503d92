"""Curriculum filtering on scripted policies with known pass rates."""

from __future__ import annotations

from searchrl.curriculum.difficulty import (
    RefillingSampler,
    estimate_difficulty,
    fill_informative_groups,
    filter_by_difficulty,
    group_has_variance,
)
from searchrl.rl.records import RolloutRecord
from searchrl.types import QAExample

G = 8


def _examples(n: int) -> list[QAExample]:
    return [QAExample(id=f"q{i}", question=f"question {i}?", golden_answers=("a",),
                      hops=1 + i % 3) for i in range(n)]


def _scripted(pass_counts: dict[str, int], searches: int = 1):
    """A policy that solves question q exactly pass_counts[q] times out of G."""

    def rollout(examples: list[QAExample]) -> list[RolloutRecord]:
        out = []
        for ex in examples:
            for k in range(G):
                correct = k < pass_counts[ex.id]
                out.append(RolloutRecord(
                    example_id=ex.id, sample_index=k, prompt_ids=[], response_ids=[],
                    loss_mask=[], old_logprobs=[], text="", turns=1,
                    queries=["x"] * searches, correct=correct,
                    reward=1.0 if correct else 0.0))
        return out

    return rollout


def test_pass_rate_uses_binary_correctness_not_shaped_reward() -> None:
    ex = _examples(1)
    records = _scripted({"q0": 2})(ex)
    for r in records:
        r.reward = 0.9  # shaped reward identical for everyone: must not matter
    (d,) = estimate_difficulty(ex, records)
    assert d.pass_rate == 2 / G and d.samples == G and d.mean_searches == 1.0


def test_filter_keeps_the_teaching_band_and_orders_easy_to_hard() -> None:
    ex = _examples(6)
    counts = {"q0": 0, "q1": 8, "q2": 4, "q3": 6, "q4": 1, "q5": 4}
    diffs = estimate_difficulty(ex, _scripted(counts)(ex))
    result = filter_by_difficulty(diffs, min_pass_rate=0.0, max_pass_rate=1.0,
                                  order="easy_to_hard")
    assert [d.example_id for d in result.kept] == ["q3", "q2", "q5", "q4"]
    assert {d.example_id for d, _ in result.dropped} == {"q0", "q1"}
    reasons = dict((d.example_id, r) for d, r in result.dropped)
    assert "never solved" in reasons["q0"] and "always solved" in reasons["q1"]
    assert result.counts == {"questions_in": 6, "kept": 4, "dropped": 2,
                             "dropped_never_solved": 1, "dropped_always_solved": 1}
    hard_first = filter_by_difficulty(diffs, min_pass_rate=0.0, max_pass_rate=1.0,
                                      order="hard_to_easy")
    assert [d.example_id for d in hard_first.kept] == ["q4", "q5", "q2", "q3"]


def test_configurable_band_drops_with_reason() -> None:
    ex = _examples(4)
    diffs = estimate_difficulty(ex, _scripted({"q0": 1, "q1": 4, "q2": 7, "q3": 5})(ex))
    result = filter_by_difficulty(diffs, min_pass_rate=0.2, max_pass_rate=0.8, order="mixed")
    assert {d.example_id for d in result.kept} == {"q1", "q3"}
    assert any("below min_pass_rate" in r for _, r in result.dropped)
    assert any("above max_pass_rate" in r for _, r in result.dropped)


def test_zero_variance_detection() -> None:
    assert not group_has_variance([1.0] * 4)
    assert not group_has_variance([0.1])
    assert group_has_variance([0.0, 0.0, 1.0])


def test_dynamic_refill_keeps_batch_size_and_reports_zero_variance() -> None:
    ex = _examples(12)
    # Every third question is never solved: a zero-variance group to skip and refill.
    counts = {e.id: (0 if i % 3 == 0 else 3) for i, e in enumerate(ex)}
    sampler = RefillingSampler(pool=ex)
    groups, stats = fill_informative_groups(sampler, n_groups=4, group_size=G,
                                            rollout_fn=_scripted(counts))
    assert len(groups) == 4
    assert all(group_has_variance([r.reward for r in g]) for g in groups)
    assert stats["zero_variance_fraction"] > 0
    assert stats["groups_drawn"] >= 5 and stats["refill_rounds"] >= 1


def test_refill_gives_up_after_bounded_rounds_and_tracks_solved() -> None:
    ex = _examples(3)
    sampler = RefillingSampler(pool=ex)
    groups, stats = fill_informative_groups(sampler, n_groups=2, group_size=G,
                                            rollout_fn=_scripted(dict.fromkeys(
                                                ["q0", "q1", "q2"], G)),
                                            max_refill_rounds=2)
    assert groups == [] and stats["zero_variance_fraction"] == 1.0
    assert stats["solved_share_of_pool"] == 1.0


def test_sampler_state_round_trips() -> None:
    ex = _examples(5)
    a = RefillingSampler(pool=ex)
    a.draw(3)
    b = RefillingSampler(pool=ex)
    b.load_state_dict(a.state_dict())
    assert [e.id for e in a.draw(4)] == [e.id for e in b.draw(4)] == ["q3", "q4", "q0", "q1"]
    assert a.epoch == 1


def test_retire_removes_solved_keeps_cursor_and_round_trips() -> None:
    ex = _examples(6)
    sampler = RefillingSampler(pool=list(ex))
    sampler.draw(3)  # next is q3
    assert sampler.retire({"q1", "q4"}) == 2
    assert [e.id for e in sampler.pool] == ["q0", "q2", "q3", "q5"]
    resumed = RefillingSampler(pool=list(ex))
    resumed.load_state_dict(sampler.state_dict())
    assert [e.id for e in sampler.draw(3)] == [e.id for e in resumed.draw(3)] == ["q3", "q5", "q0"]
    assert sampler.retire({e.id for e in ex}) == 3  # never empties the pool
    assert len(sampler.pool) == 1
