"""DeepSpeed setup for the policy update, on CPU (one process, gloo) and on GPUs.

On CPU (`DS_ACCELERATOR=cpu`) the trainer is its own single rank: we set the rendezvous
environment (loopback address, a free port, rank 0 of 1) and initialise gloo, so no launcher
is needed (several CPU ranks work too when RANK/WORLD_SIZE/MASTER_* are set, as the
multi-rank test does). On GPUs the `deepspeed` launcher sets the same variables for every
rank and we only call `init_distributed` with nccl.

The small collectives below (`rank`, `barrier`, `all_reduce`) are no-ops in one process, so
the trainer calls them unconditionally.

The engine gets a plain torch AdamW as client optimizer and our LR schedule; DeepSpeed owns
gradient accumulation, clipping and ZeRO partitioning. A JSON config (`train.deepspeed_config`,
e.g. configs/deepspeed/zero2.json) may set anything; "auto" values and the batch sizes are
filled from `TrainConfig`, so the two never disagree.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch

from searchrl.config import TrainConfig


class DeepSpeedSetupError(RuntimeError):
    """DeepSpeed could not be configured; the message names the setting to change."""


def free_port() -> int:
    """A port nothing listens on now (the OS picks it), for a rendezvous or a server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(device: str) -> None:
    """Initialise torch.distributed once per process (no-op when already initialised)."""
    import deepspeed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        if os.environ.get("DS_ACCELERATOR") != "cpu":
            raise DeepSpeedSetupError(
                f"DS_ACCELERATOR={os.environ['DS_ACCELERATOR']!r} but run.device=cpu; "
                "unset it or export DS_ACCELERATOR=cpu before importing deepspeed")
        _skip_shm_inference_op()
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    else:
        deepspeed.init_distributed(dist_backend="nccl", verbose=False)


def _skip_shm_inference_op() -> None:
    """Keep DeepSpeed's CPU backend from JIT-compiling its shared-memory all-reduce op.

    The backend builds it at init (about 30 s in every fresh environment: the build is cached
    per install path) for `inference_all_reduce`, which only DeepSpeed inference calls;
    training reduces through torch.distributed (gloo). DeepSpeed skips ops its
    `deepspeed.ops.__compatible_ops__` table marks incompatible (a dict kept in the module,
    so the mark holds for this process).
    """
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible[ShareMemCommBuilder.NAME] = False


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_world_size())
    return 1


def rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return 0


def barrier() -> None:
    if world_size() > 1:
        torch.distributed.barrier()


def all_reduce(values: Sequence[float], op: Literal["sum", "max", "min"] = "sum"
               ) -> list[float]:
    """Element-wise reduction of `values` over ranks (every rank must pass as many)."""
    if world_size() == 1:
        return [float(v) for v in values]
    ops = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX,
           "min": torch.distributed.ReduceOp.MIN}
    # gloo reduces CPU tensors; nccl needs them on the rank's GPU.
    device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(tensor, op=ops[op])
    return [float(v) for v in tensor.cpu()]


@contextmanager
def full_parameters(engine: Any) -> Iterator[None]:
    """Inside, `engine.module` holds its whole parameters on every rank (ZeRO-3 gathers its
    partitions; other stages already do): for weight sync to a generator and final saves."""
    if int(engine.zero_optimization_stage()) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            yield
    else:
        yield


def ds_config(cfg: TrainConfig, samples_per_step: int, device: str,
              n_world: int = 1) -> dict[str, Any]:
    """The DeepSpeed JSON for rollout batches of `samples_per_step` (the trainer sets the
    gradient-accumulation boundaries itself: one optimizer step per PPO mini-batch).

    Each rank trains on its `samples_per_step / n_world` share in micro-batches of
    `cfg.micro_batch_size`; gradient_accumulation_steps is that count (DeepSpeed's batch-size
    bookkeeping; the optimizer steps at the boundaries the trainer sets).
    """
    if samples_per_step % n_world:
        raise DeepSpeedSetupError(
            f"{samples_per_step} rollouts per step do not split over {n_world} ranks; make "
            "train.questions_per_step * rollout.group_size a multiple of the world size")
    per_rank = samples_per_step // n_world
    micro = min(cfg.micro_batch_size, per_rank)
    gas = math.ceil(per_rank / micro)
    base: dict[str, Any] = {}
    if cfg.deepspeed_config is not None:
        path = Path(cfg.deepspeed_config)
        if not path.is_file():
            raise DeepSpeedSetupError(f"train.deepspeed_config: {path} not found")
        try:
            base = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise DeepSpeedSetupError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})"
                                      ) from exc
    out = dict(base)
    out["train_micro_batch_size_per_gpu"] = micro
    out["gradient_accumulation_steps"] = gas
    out["train_batch_size"] = micro * gas * n_world
    if out.get("gradient_clipping", "auto") == "auto":
        out["gradient_clipping"] = cfg.grad_clip
    zero = dict(out.get("zero_optimization", {}))
    if cfg.deepspeed_config is None or zero.get("stage", "auto") == "auto":
        zero["stage"] = cfg.zero_stage
    out["zero_optimization"] = zero
    if device == "cpu":
        # CPU autocast to bf16 is slow and lossy for a tiny model; CPU trains in fp32.
        out.pop("bf16", None)
        out.pop("fp16", None)
    out.setdefault("steps_per_print", 10**9)
    out.setdefault("wall_clock_breakdown", False)
    return out


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """Linear warmup over `cfg.warmup_steps`, then constant (the usual GRPO schedule)."""
    warmup = max(1, cfg.warmup_steps)
    return lambda step: min(1.0, (step + 1) / warmup)


def build_engine(model: torch.nn.Module, cfg: TrainConfig, samples_per_step: int,
                 device: str) -> Any:
    """A DeepSpeed engine around `model` with AdamW + the LR schedule; returns the engine."""
    import deepspeed

    init_distributed(device)
    config = ds_config(cfg, samples_per_step, device, world_size())
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  betas=(0.9, 0.99))

    def scheduler(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))

    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           lr_scheduler=scheduler, config=config)
    return engine
