"""Difficulty estimation and filtering (pure): keep the questions that teach.

GRPO learns nothing from a group whose rollouts all get the same reward. Difficulty is the pass
rate on *binary correctness* (never the shaped reward, which a well-formatted wrong answer
would inflate) over G sampled rollouts of the current policy.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from searchrl.rl.records import RolloutRecord
from searchrl.types import QAExample

Order = Literal["easy_to_hard", "hard_to_easy", "mixed"]


@dataclass(frozen=True)
class QuestionDifficulty:
    example_id: str
    hops: int | None
    samples: int
    pass_rate: float  # share of the G rollouts that are correct (binary EM)
    mean_searches: float

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


def estimate_difficulty(examples: Sequence[QAExample],
                        records: Sequence[RolloutRecord]) -> list[QuestionDifficulty]:
    """Aggregate rollouts per question; every example must have at least one rollout."""
    by_id: dict[str, list[RolloutRecord]] = {}
    for record in records:
        by_id.setdefault(record.example_id, []).append(record)
    missing = [ex.id for ex in examples if ex.id not in by_id]
    if missing:
        raise ValueError(f"no rollouts for {len(missing)} questions, e.g. {missing[:3]}")
    out = []
    for ex in examples:
        group = by_id[ex.id]
        out.append(QuestionDifficulty(
            example_id=ex.id, hops=ex.hops, samples=len(group),
            pass_rate=sum(r.correct for r in group) / len(group),
            mean_searches=sum(len(r.queries) for r in group) / len(group),
        ))
    return out


@dataclass
class FilterResult:
    kept: list[QuestionDifficulty]  # in training order
    dropped: list[tuple[QuestionDifficulty, str]]  # with the reason
    counts: dict[str, int] = field(default_factory=dict)


def filter_by_difficulty(difficulties: Sequence[QuestionDifficulty], *, min_pass_rate: float,
                         max_pass_rate: float, order: Order, seed: int = 0,
                         drop_all_correct: bool = True, drop_all_wrong: bool = True
                         ) -> FilterResult:
    """Drop questions outside the pass-rate band (and, by default, the zero-variance ends
    pass_rate == 0 / == 1, which teach GRPO nothing), then order the rest.

    `easy_to_hard` sorts by descending pass rate (ties by fewer hops first, then id, so the
    order is deterministic); `mixed` shuffles with `seed`.
    """
    kept: list[QuestionDifficulty] = []
    dropped: list[tuple[QuestionDifficulty, str]] = []
    for d in difficulties:
        if drop_all_wrong and d.pass_rate == 0.0:
            dropped.append((d, "never solved (pass rate 0): no reward variance"))
        elif drop_all_correct and d.pass_rate == 1.0:
            dropped.append((d, "always solved (pass rate 1): no reward variance"))
        elif d.pass_rate < min_pass_rate:
            dropped.append((d, f"pass rate {d.pass_rate:.2f} below min_pass_rate {min_pass_rate}"))
        elif d.pass_rate > max_pass_rate:
            dropped.append((d, f"pass rate {d.pass_rate:.2f} above max_pass_rate {max_pass_rate}"))
        else:
            kept.append(d)
    if order == "mixed":
        random.Random(seed).shuffle(kept)
    else:
        kept.sort(key=lambda d: (-d.pass_rate, d.hops or 0, d.example_id))
        if order == "hard_to_easy":
            kept.reverse()
    counts = {
        "questions_in": len(difficulties),
        "kept": len(kept),
        "dropped": len(dropped),
        "dropped_never_solved": sum("pass rate 0)" in r for _, r in dropped),
        "dropped_always_solved": sum("pass rate 1)" in r for _, r in dropped),
    }
    if counts["kept"] + counts["dropped"] != counts["questions_in"]:
        raise AssertionError("kept + dropped != questions in")
    return FilterResult(kept=kept, dropped=dropped, counts=counts)


# --- dynamic filtering during training (DAPO-style)


def group_has_variance(rewards: Sequence[float], tol: float = 1e-8) -> bool:
    return len(rewards) > 1 and max(rewards) - min(rewards) > tol


@dataclass
class RefillingSampler:
    """Hands out training questions in curriculum order, cycling over the pool.

    The trainer draws `n` questions, runs their groups, keeps the groups with reward variance
    and draws again for the shortfall (at most `max_refill_rounds` times) so each update sees a
    full batch of informative groups. The position is part of the checkpoint (`state_dict`).
    """

    pool: list[QAExample]
    seed: int = 0
    position: int = 0
    epoch: int = 0
    solved_ids: set[str] = field(default_factory=set)
    retired_ids: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.pool:
            raise ValueError("RefillingSampler needs a non-empty pool")

    def draw(self, n: int) -> list[QAExample]:
        out: list[QAExample] = []
        for example in self._cycle():
            out.append(example)
            if len(out) == n:
                break
        return out

    def _cycle(self) -> Iterator[QAExample]:
        while True:
            if self.position >= len(self.pool):
                self.position = 0
                self.epoch += 1
            example = self.pool[self.position]
            self.position += 1
            yield example

    def retire(self, example_ids: set[str]) -> int:
        """Remove questions the policy has solved from the pool (never the last one); the
        cursor keeps pointing at the same next question. Returns how many were removed."""
        keep = [ex for ex in self.pool if ex.id not in example_ids]
        if not keep:
            keep = self.pool[-1:]
        removed_before = sum(1 for ex in self.pool[: self.position] if ex.id in example_ids)
        removed = len(self.pool) - len(keep)
        self.pool = keep
        self.position = max(0, self.position - removed_before)
        self.retired_ids |= {i for i in example_ids if i not in {ex.id for ex in keep}}
        return removed

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "epoch": self.epoch,
                "solved_ids": sorted(self.solved_ids), "retired_ids": sorted(self.retired_ids)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        retired = set(state.get("retired_ids", []))
        if retired:
            self.pool = [ex for ex in self.pool if ex.id not in retired]
        self.retired_ids = retired
        self.position = int(state["position"])
        self.epoch = int(state["epoch"])
        self.solved_ids = set(state.get("solved_ids", []))


def fill_informative_groups(sampler: RefillingSampler, n_groups: int, group_size: int,
                            rollout_fn: Any, max_refill_rounds: int = 2
                            ) -> tuple[list[list[RolloutRecord]], dict[str, float]]:
    """Draw questions and roll them out until `n_groups` groups with reward variance are
    collected (or the refill rounds run out). `rollout_fn(examples) -> list[RolloutRecord]`
    returns question-major records, `group_size` per example.

    Returns the informative groups (at most n_groups) and stats: the zero-variance fraction of
    all groups rolled out this step, the number drawn and the refill rounds used.
    """
    groups: list[list[RolloutRecord]] = []
    drawn = zero_var = rounds = 0
    need = n_groups
    while need > 0 and rounds <= max_refill_rounds:
        examples = sampler.draw(need)
        records = rollout_fn(examples)
        if len(records) != len(examples) * group_size:
            raise ValueError(f"rollout_fn returned {len(records)} records for "
                             f"{len(examples)} x {group_size}")
        for i in range(len(examples)):
            group = records[i * group_size:(i + 1) * group_size]
            drawn += 1
            if group_has_variance([r.reward for r in group]):
                groups.append(group)
            else:
                zero_var += 1
                if all(r.correct for r in group):
                    sampler.solved_ids.add(group[0].example_id)
        need = n_groups - len(groups)
        rounds += 1
    stats = {"zero_variance_fraction": zero_var / max(drawn, 1), "groups_drawn": float(drawn),
             "refill_rounds": float(rounds - 1), "informative_groups": float(len(groups)),
             "solved_share_of_pool": len(sampler.solved_ids) / len(sampler.pool)}
    return groups[:n_groups], stats
