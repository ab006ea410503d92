"""Stage 3: the difficulty estimate and the curriculum the trainer samples from."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from searchrl.config.base import Bound, Section, check_bounds, shapes

_SAMPLING = shapes("filter_curriculum", "train_policy", "train_run")


class CurriculumConfig(Section):
    # The difficulty estimate; training sees its result through the curriculum's reference.
    SHAPES = shapes("filter_curriculum")
    enabled: bool = True
    # Samples of the cold-start policy per question for its pass rate (not rollout.group_size,
    # the GRPO group the trainer samples per question).
    samples_per_question: int = 8
    min_pass_rate: float = 0.0
    max_pass_rate: float = 1.0
    order: Literal["easy_to_hard", "hard_to_easy", "mixed"] = "easy_to_hard"
    # Read by the trainer while it samples.
    dynamic_filtering: Annotated[bool, _SAMPLING] = True
    # Refill rounds per step when groups have zero reward variance (dynamic filtering).
    max_refill_rounds: Annotated[int, _SAMPLING] = Field(2, ge=0)
    reestimate_every: Annotated[int, _SAMPLING] = 0
    # Cap on questions whose difficulty is estimated (None = the whole train split).
    max_questions: int | None = None

    @model_validator(mode="after")
    def _sensible(self) -> CurriculumConfig:
        if self.enabled:
            check_bounds("curriculum", self, {"samples_per_question": (
                ">=", 2, ": one sample per question has pass rate 0 or 1, so every question "
                         "would be dropped for lack of reward variance")})
        rate: Bound = (">=", 0.0, " (a pass rate is in 0..1)")
        check_bounds("curriculum", self, {
            "min_pass_rate": rate, "max_pass_rate": rate,
            "reestimate_every": (">=", 0, " (0: never)"),
            "max_questions": (">=", 1, " (null: the whole train split)")})
        if self.max_pass_rate > 1.0:
            raise ValueError(f"curriculum.max_pass_rate={self.max_pass_rate}: must be <= 1 "
                             "(a pass rate is in 0..1)")
        if self.min_pass_rate > self.max_pass_rate:
            raise ValueError(f"curriculum.min_pass_rate={self.min_pass_rate} is above "
                             f"curriculum.max_pass_rate={self.max_pass_rate}: no question "
                             "could be kept")
        return self
