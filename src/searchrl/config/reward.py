"""The shaped reward GRPO trains on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from searchrl.config.base import Section, shapes


class RewardConfig(Section):
    SHAPES = shapes("filter_curriculum", "train_policy", "train_run", "evaluate_policy")
    # Graded answer score in the shaped reward (curriculum/eval use binary EM regardless).
    kind: Literal["em", "f1"] = "em"
    # Reward of a well-formed but wrong completion (Search-R1's lambda_f).
    format_weight: float = Field(0.1, ge=0.0, le=1.0)
    # Subtracted per search the policy issued.
    search_cost: float = Field(0.0, ge=0.0)
    # "all": every completion pays. "correct": only answers that score pay, scaled by the
    # score, so a wrong answer is never better than a right one and, in the many all-wrong
    # groups of a weak start, fewer searches is not what the advantages teach (with "all",
    # cost 0.05 on the tiny default drove the policy to never search).
    search_cost_applies_to: Literal["all", "correct"] = "all"
    # What a malformed completion (format_score 0) earns, `a` its graded answer score:
    #   "scale":   correct_bad_format * a  (a right answer keeps most of its reward; this
    #              repo's original scheme, which the tiny demo was measured with)
    #   "forfeit": 0, whatever the answer (Search-R1 with its format check: a malformed
    #              trajectory forfeits the answer reward)
    #   "penalty": malformed_penalty, whatever the answer (follow-ups that punish format
    #              errors, e.g. -0.5 / -1.0, so malformed ranks below any well-formed wrong)
    malformed: Literal["scale", "forfeit", "penalty"] = "scale"
    # "scale" only.
    correct_bad_format: float = Field(0.8, ge=0.0, le=1.0)
    # "penalty" only; bounded so one format slip never outweighs a right answer's +1.
    malformed_penalty: float = Field(-0.5, ge=-1.0, le=0.0)
    # A well-formed answer the template opened (after `rollout.max_turns`, or in the
    # no_search / retrieve_once baselines) earns forced_answer_scale * a and no format
    # credit: the answer is the policy's, the decision to answer was not. One whose answer
    # the policy never closed properly is malformed. 0.8 = correct_bad_format's default, which
    # is what forced answers earned before this case had its own value.
    forced_answer_scale: float = Field(0.8, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _scheme_fields_apply(self) -> RewardConfig:
        # A value the chosen scheme ignores is a setting someone believes in and nothing
        # reads: reject it rather than let a config say one thing and train another. (The
        # default passes, so `reward.malformed=...` can override a file that pins it.)
        unused = {"correct_bad_format": "scale", "malformed_penalty": "penalty"}
        for name, scheme in unused.items():
            value = getattr(self, name)
            if self.malformed != scheme and value != type(self).model_fields[name].default:
                raise ValueError(f"reward.{name}={value} applies only with reward.malformed: "
                                 f"{scheme} (got malformed: {self.malformed}); remove it or "
                                 f"set malformed: {scheme}")
        return self
