"""Stage 4: GRPO training, its SFT cold start, the rejection-sampling comparator and how its
ranks are launched."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from searchrl.config.base import OPERATIONAL, Section, check_bounds, shapes

ImperfectKind = Literal["skipped_search", "wrong_hop"]
IMPERFECT_KINDS: tuple[ImperfectKind, ...] = ("skipped_search", "wrong_hop")


class SFTConfig(Section):
    SHAPES = shapes("cold_start")

    @field_validator("imperfect_kinds")
    @classmethod
    def _kinds_weighted(cls, value: dict[ImperfectKind, float]) -> dict[ImperfectKind, float]:
        if any(w < 0 for w in value.values()) or not sum(value.values()) > 0:
            raise ValueError("imperfect_kinds weights must be >= 0 with a positive sum, got "
                             f"{value}")
        return value


    enabled: bool = True
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 16
    # Rows per forward pass (None: the whole batch in one). Below `batch_size` a batch's
    # gradient is accumulated over micro-batches of its demos sorted by length, so a short
    # demo is not padded to the batch's longest; the loss is still the token mean over the
    # whole batch, equal up to float rounding. A random batch of 16 tiny-world demos is about
    # 37% padding; 4 rows per pass made the tiny cold start's SFT 22% faster (184 -> 144 s, 2
    # epochs). Another rounding gives another SFT start: results differ per seed as seeds do
    # (docs/results/question_types.md), so compare a change over seeds, not one run.
    micro_batch_size: int | None = Field(None, ge=1)
    imperfect_fraction: float = Field(0.2, ge=0.0, le=1.0)
    # Relative weights of the imperfect kinds (train/cold_start/demos.py): `skipped_search`
    # stops the chain early and answers the entity reached, `wrong_hop` searches it all and
    # answers an earlier hop's entity.
    imperfect_kinds: dict[ImperfectKind, float] = Field(
        default_factory=lambda: dict.fromkeys(IMPERFECT_KINDS, 1.0))
    # Demos from the train split (0: only extra worlds, so no name RL trains on was an SFT
    # output target).
    n_demos: int = Field(800, ge=0)
    # Share of demos in the no_search / retrieve_once formats (so those baselines are real).
    baseline_fraction: float = Field(0.0, ge=0.0, le=1.0)
    # Demos from `extra_worlds` freshly generated synthetic worlds (data.synthetic with other
    # seeds), `extra_world_demos` in all, on top of `n_demos`: names to copy, not memorise.
    extra_worlds: int = Field(0, ge=0)
    extra_world_demos: int = Field(0, ge=0)
    # Weight of the language-modelling loss on context tokens (prompt, passages) of the demos;
    # teaches a from-scratch model to copy names from its context (0: policy tokens only).
    context_loss_weight: float = Field(0.0, ge=0.0)
    # Also language-model every corpus passage (context loss only, in the rollout's
    # `<information>` layout): a from-scratch model's stand-in for having read its corpus.
    corpus_lm: bool = False
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # A demo longer than this raises (truncation would cut the answer the demo is for).
    max_len: int = 1024

    @model_validator(mode="after")
    def _sensible(self) -> SFTConfig:
        if self.enabled:  # a cold start that changes nothing is then trained on
            check_bounds("train.sft", self, {
                "epochs": (">=", 1, " (or train.sft.enabled=false)"),
                "lr": (">", 0, ": the cold start would not change the model"),
                "batch_size": (">=", 1, ""), "max_len": (">=", 1, ""),
                "weight_decay": (">=", 0, ""),
                "grad_clip": (">", 0, ": gradients clipped to norm 0 change nothing")})
        return self


class LaunchConfig(Section):
    """How the train stage runs its ranks. `inprocess`: one rank inside the stage's own
    process (the CPU default). `deepspeed`: the stage starts DeepSpeed's launcher as a
    subprocess (`deepspeed --num_gpus <ranks> [--hostfile F --num_nodes N] --module searchrl
    train-rank`), waits for it and reads the reference rank 0 wrote; on CPU the ranks are gloo
    processes. A re-run resumes from the newest checkpoint either way."""

    # Ranks shard the rollouts (checkpoints hold every rank's sampler state).
    mode: Literal["inprocess", "deepspeed"] = "inprocess"
    ranks: int = Field(1, ge=1)  # per node: GPUs on CUDA, processes on CPU
    nodes: int = Field(1, ge=1)
    # DeepSpeed hostfile (`host slots=N` lines) for nodes > 1
    hostfile: Annotated[Path | None, OPERATIONAL] = None
    master_port: Annotated[int | None, OPERATIONAL] = Field(None, ge=1, le=65535)  # None: free
    # Seconds without a new line in rank 0's log before the stage gives up (None: never).
    stall_timeout_s: Annotated[float | None, OPERATIONAL] = Field(None, gt=0.0)

    @model_validator(mode="after")
    def _consistent(self) -> LaunchConfig:
        if self.mode == "inprocess" and (self.ranks > 1 or self.nodes > 1):
            raise ValueError("train.launch.mode=inprocess runs one rank; set "
                             "train.launch.mode=deepspeed for ranks/nodes > 1")
        if self.nodes > 1 and self.hostfile is None:
            raise ValueError("train.launch.nodes > 1 needs train.launch.hostfile")
        return self


# Shapes the trained policy but not its trajectory so far: a run that differs only in these
# resumes the other's checkpoints (e.g. more steps train on).
_RESUMABLE = shapes("train_policy")


class RejectionSamplingConfig(Section):
    """The cheapest alternative to RL (Search-R1's RFT comparator): sample rollouts of the SFT
    policy on the train questions, keep the correct well-formed ones, fine-tune the SFT policy
    on them. Evaluated as the `rejection_sampling` system; never the policy GRPO trains."""

    SHAPES = shapes("train_policy", "evaluate_policy")
    enabled: bool = False
    samples_per_question: int = Field(8, ge=1)
    # Train questions sampled (None: all of the curriculum set).
    max_questions: int | None = Field(None, ge=1)
    epochs: int = Field(2, ge=1)
    lr: float = Field(5e-4, gt=0.0)


class TrainConfig(Section):
    SHAPES = shapes("train_policy", "train_run")
    steps: Annotated[int, _RESUMABLE] = 60
    questions_per_step: int = 8
    lr: float = 2e-4
    weight_decay: float = 0.0
    clip_eps: float = 0.2
    kl_coef: float = 0.01
    # PPO updates per rollout batch: each rank's share is split into `ppo_mini_batches`
    # mini-batches, one optimizer step each (gradients accumulated over its micro-batches of
    # `micro_batch_size`), and the pass repeats `ppo_epochs` times (mini-batch order shuffled
    # per epoch, seeded by step). The ratio to the sampling policy is 1 on the first mini-batch
    # and clipped to [1 - clip_eps, 1 + clip_eps] after. 1 and 1: one step, ratio exactly 1.
    # `warmup_steps` counts optimizer steps (ppo_epochs * ppo_mini_batches per step).
    ppo_epochs: int = Field(1, ge=1)
    ppo_mini_batches: int = Field(1, ge=1)
    micro_batch_size: int = 16
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    std_normalize: bool = True
    zero_stage: Literal[0, 1, 2, 3] = 0
    deepspeed_config: Path | None = None
    checkpoint_every: Annotated[int, OPERATIONAL] = 20  # resume is exact from any step
    keep_checkpoints: Annotated[int, OPERATIONAL] = 2
    max_nonfinite_steps: Annotated[int, _RESUMABLE] = 3
    resume: Annotated[bool, OPERATIONAL] = True
    grad_clip: float = 1.0
    warmup_steps: int = Field(0, ge=0)
    # Greedy exact match on `eval_questions` dev questions every `eval_every` steps (0: off),
    # for the learning curve; the evaluation stage does the real held-out measurement.
    eval_every: Annotated[int, _RESUMABLE] = Field(0, ge=0)
    eval_questions: Annotated[int, _RESUMABLE] = Field(60, ge=1)
    # Keep the policy of the best dev evaluation (`best_policy/`, carried across resumes) and
    # hand that one to evaluation and the registry instead of the last step's: a run whose dev
    # metric peaks mid-way is then judged on its peak. The start policy is evaluated first
    # (step 0) and is a candidate: when no step beats it, the start is handed on and the gate
    # says training changed nothing. `select_metric` is a key the dev evaluation logs (dev_em,
    # dev_em_hop2, dev_searches_all, ...); ties keep the earlier step.
    keep_best: Annotated[bool, _RESUMABLE] = False
    select_metric: Annotated[str, _RESUMABLE] = "dev_em"
    select_mode: Annotated[Literal["max", "min"], _RESUMABLE] = "max"
    # Early stopping (needs keep_best): stop once this many dev evaluations in a row have not
    # beaten the best (0: always run `steps`). The best policy is what is evaluated either
    # way; stopping saves the steps after it, at the risk of a later, better evaluation.
    early_stop_patience: int = Field(0, ge=0)
    # What GRPO starts from: `base` the configured base model through the cold start (the
    # recipe), `champion` the registry's champion policy (eval.registry_model_name @
    # eval.champion_alias; its version enters the stage's key). Fails when none is registered.
    init: Literal["base", "champion"] = "base"
    # PPO-ptx (train/grpo/ptx.py): each optimizer step adds `ptx_coef` x the SFT loss on
    # `ptx_rows` gold demonstrations of `ptx_worlds` synthetic worlds the cold start never saw
    # (`ptx_demos` in all, cycled), so RL keeps the copying the cold start taught. 0: off.
    ptx_coef: float = Field(0.0, ge=0.0)
    ptx_rows: int = Field(16, ge=1)
    ptx_worlds: int = Field(4, ge=1)
    ptx_demos: int = Field(2400, ge=1)
    sft: SFTConfig = SFTConfig()
    rejection_sampling: RejectionSamplingConfig = RejectionSamplingConfig()
    launch: LaunchConfig = LaunchConfig()

    def deepspeed_config_sha256(self) -> str | None:
        """sha256 of the `deepspeed_config` file's bytes (None: none set; "missing": not
        found, which the trainer refuses). Its contents (ZeRO stage, precision, optimizer)
        shape the training run as much as the fields here, so they enter the train stage's
        cache key and the checkpoints' run identity, not only the path: an edited file under
        the same name retrains from step 0."""
        if self.deepspeed_config is None:
            return None
        try:
            return hashlib.sha256(Path(self.deepspeed_config).read_bytes()).hexdigest()
        except OSError:
            return "missing"

    @model_validator(mode="after")
    def _selectable(self) -> TrainConfig:
        if self.keep_best and self.eval_every == 0:
            raise ValueError("train.keep_best selects on the dev evaluation: set "
                             "train.eval_every > 0 (or train.keep_best=false)")
        if self.early_stop_patience and not self.keep_best:
            raise ValueError("train.early_stop_patience counts dev evaluations without a new "
                             "best: set train.keep_best=true (or early_stop_patience=0)")
        if not self.select_metric.startswith("dev_"):
            raise ValueError(f"train.select_metric={self.select_metric!r}: must be a dev "
                             "metric the trainer logs (dev_em, dev_em_hop<N>, dev_searches_all)")
        return self

    @model_validator(mode="after")
    def _sensible(self) -> TrainConfig:
        check_bounds("train", self, {
            "steps": (">=", 1, ": a run without steps would publish the cold-start policy "
                               "as trained"),
            "questions_per_step": (">=", 1, ""),
            "lr": (">", 0, ": the policy would not change"),
            "micro_batch_size": (">=", 1, ""),
            "clip_eps": (">", 0, ": a zero clip range stops every update after the first"),
            "kl_coef": (">=", 0, ""), "weight_decay": (">=", 0, ""),
            "checkpoint_every": (">=", 0, " (0: only the last step)"),
            "keep_checkpoints": (">=", 1, ": a run must keep the checkpoint it resumes from"),
            "max_nonfinite_steps": (">=", 0, ""),
            "grad_clip": (">=", 0, " (0: off)")})
        return self
