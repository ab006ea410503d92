"""Stage 6: the go/no-go gate's costs, margins and report."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from searchrl.config.base import Section, shapes


class GateConfig(Section):
    SHAPES = shapes("decide_go_no_go")
    gpu_type: str = "cpu-2core"
    gpu_price_per_hour: float = 0.10
    # None -> measured: wall time x devices of curriculum, training and evaluation. A number
    # replaces that measurement (and the projection below) as the training run's device-hours.
    training_gpu_hours: float | None = None
    # The full run a prototype's measured training cost is projected to (training only;
    # curriculum and evaluation are counted as measured): x full_run_tokens / prototype tokens
    # (rollout_tokens + update_tokens summed over steps, x devices) when set, else
    # x full_run_steps / steps done. Both None -> the prototype's own cost is used.
    full_run_steps: int | None = Field(None, ge=1)
    full_run_tokens: float | None = Field(None, gt=0)
    min_gold_pairs: int = 200
    production_queries_per_month: float = 1_000_000
    small_model_tokens_per_query: float | None = None  # None -> measured in evaluation
    small_model_price_per_1k_tokens: float = 0.0002
    frontier_tokens_per_query: float = 1500
    frontier_price_per_1k_tokens: float = 0.01
    # A baseline name from eval.baselines, or "best": the stronger by EM of the evaluated
    # learned systems without RL (sft, rejection_sampling); never a fixed program or prompt
    # format (scripted, no_search, retrieve_once) or the champion unless named here.
    comparison_baseline: str = "best"
    # Without eval.frontier the accuracy condition can only be measured against a stand-in
    # (comparison_baseline); it passes only when this allows it (labelled so in the report).
    allow_stand_in_comparator: bool = False
    min_accuracy_margin: float = 0.05
    max_payback_months: float = 6.0
    # Non-inferiority: GO needs the paired EM delta vs the registry's champion to have its
    # lower bound >= -champion_margin (a GO never replaces a stronger champion).
    champion_margin: float = Field(0.02, ge=0.0)
    # Per question type and hop count, a slice whose paired EM delta vs the comparator or the
    # champion has its interval's upper bound < 0 is a regression: an aggregate win can hide
    # one kind of question collapsing. "warn": the report marks it; "fail": NO-GO naming it.
    slice_regression: Literal["warn", "fail"] = "warn"
    # Smaller slices are reported but never flagged: a handful of questions is noise.
    slice_min_questions: int = Field(5, ge=1)
    # A slice (hop count, type or named slice) is shown as a win only on at least this many
    # questions with its paired interval above 0; fewer: "too few to claim", never a win.
    slice_claim_min_questions: int = Field(30, ge=1)
    registry_alias: str = "champion"
    # A promotions freeze: the gate decides, reports and registers the candidate as usual but
    # never moves `registry_alias` (the report says so). For a release freeze, an incident,
    # or while a rolled-back champion is investigated.
    freeze_promotions: bool = False
    payback_horizon_months: int = Field(24, ge=1)  # x-axis of the payback curve plot
    # Trainer metrics plotted as the training curve (a key matches `m`, `*/m` or `*.m`).
    training_curve_metrics: tuple[str, ...] = ("reward_mean", "correct_rate", "dev_em")
