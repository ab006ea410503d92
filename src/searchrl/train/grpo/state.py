"""The GRPO trainer's records: what the loop in `trainer.py` works on (`TrainerState`), the best
dev evaluation it keeps (`Best`), and what a run returns (`TrainResult`).

Records only, no behaviour beyond their own fields: the trainer is built and resumed in
`setup.py`, updated in `update.py`, and its best policy selected in `selection.py`. The update
and the selection each read these records and not each other; this module imports neither.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from transformers import PreTrainedModel

from searchrl.config import PipelineConfig
from searchrl.curriculum.difficulty import RefillingSampler
from searchrl.generation.base import Generator
from searchrl.retrieval.base import Searcher
from searchrl.rl.rollout import RolloutBatch
from searchrl.sinks import MetricsSink
from searchrl.train.grpo.ptx import PtxReplay

RolloutFn = Callable[..., RolloutBatch]
GeneratorFactory = Callable[..., Generator]


@dataclass(frozen=True)
class Best:
    """The best dev evaluation so far: after `step` steps, `metric` was `value`."""

    step: int
    metric: str
    mode: Literal["max", "min"]
    value: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, text: str | None) -> Best | None:
        data = json.loads(text) if text else None
        if not isinstance(data, dict):
            return None
        return cls(step=int(data["step"]), metric=str(data["metric"]),
                   mode="min" if data["mode"] == "min" else "max", value=float(data["value"]))


# --- the trainer's state and result


@dataclass
class TrainResult:
    policy_dir: Path
    sft_dir: Path
    metrics_path: Path
    curve_path: Path | None
    steps_done: int
    resumed_from: int
    skipped_steps: int
    seconds: float  # GRPO wall seconds, earlier attempts' included (below)
    sft_seconds: float = 0.0
    # A resumed run: the training seconds of earlier attempts up to the checkpoint resumed
    # from (their work after it was redone, so it is not counted twice).
    earlier_attempts_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    final_metrics: dict[str, float] = field(default_factory=dict)
    # train.keep_best: the best dev evaluation and its policy (None: off, or never evaluated);
    # `last_value` is `train.select_metric` at the last step, when it was evaluated.
    best: Best | None = None
    best_policy_dir: Path | None = None
    last_value: float | None = None
    stopped_early: bool = False  # train.early_stop_patience ended the run before train.steps


@dataclass
class TrainerState:
    """Everything the loop works on: built by `setup_trainer`, advanced by the loop's steps."""

    config: PipelineConfig
    engine: Any  # the DeepSpeed engine (its module is the policy)
    ref: PreTrainedModel | None  # frozen start policy for the KL term (None: kl_coef == 0)
    generator: Generator
    tokenizer: Any
    sampler: RefillingSampler
    searcher: Searcher
    rollout_fn: RolloutFn
    sink: MetricsSink
    out_dir: Path
    rank: int
    n_ranks: int
    start_step: int = 0
    skipped: int = 0
    earlier_seconds: float = 0.0  # earlier attempts' seconds up to the resumed checkpoint
    started: float = field(default_factory=time.perf_counter)  # this attempt
    ptx: PtxReplay | None = None  # train.ptx_coef: the demonstrations each step replays
    best: Best | None = None  # train.keep_best: the best dev evaluation so far (rank 0)
    history: list[dict[str, Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lead: bool = field(init=False)  # rank 0: logs, evaluates, saves
    checkpoints: Path = field(init=False)
    metrics_path: Path = field(init=False)
    pad_id: int = field(init=False)

    def seconds_so_far(self) -> float:
        """Training wall seconds of this run: earlier attempts' and this one's so far."""
        return self.earlier_seconds + time.perf_counter() - self.started

    def __post_init__(self) -> None:
        self.lead = self.rank == 0
        self.checkpoints = self.out_dir / "checkpoints"
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.pad_id = int(self.tokenizer.pad_token_id)
