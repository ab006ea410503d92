"""Saving matplotlib figures.

Figures are built with `matplotlib.figure.Figure` directly, never pyplot: pyplot keeps global
state (current figure, backend) that is unsafe in Prefect worker threads and leaks figures.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from searchrl.data.io import atomic_write_bytes


def _render(fig: Figure, fmt: str, dpi: int, bbox_inches: str | None = None) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches=bbox_inches)
    return buf.getvalue()


def save_figure(fig: Figure, path: Path, *, dpi: int = 100) -> Path:
    """Write `fig` to `path` (format from the suffix) atomically: a reader sees the old file or
    the complete new one, never a partial image. Returns `path`."""
    atomic_write_bytes(path, _render(fig, path.suffix.lstrip(".") or "png", dpi))
    return path


def figure_png_base64(fig: Figure, *, dpi: int = 90) -> str:
    """`fig` as a base64 PNG (tight bounding box), for inlining in a self-contained HTML page."""
    return base64.b64encode(_render(fig, "png", dpi, bbox_inches="tight")).decode("ascii")


def plot_curve(history: Sequence[dict[str, Any]], path: Path) -> Path:
    """The training curve: reward / correctness / searches per step, and greedy dev EM by hop
    where measured."""
    steps = [h["step"] for h in history]
    fig = Figure(figsize=(14, 4))
    axes = fig.subplots(1, 3)
    axes[0].plot(steps, [h["reward_mean"] for h in history], label="reward mean")
    axes[0].plot(steps, [h["correct_rate"] for h in history], label="correct rate (sampled)")
    axes[0].set_xlabel("step")
    axes[0].legend()
    axes[0].set_title("training rollouts")
    axes[1].plot(steps, [h["searches_per_rollout"] for h in history], label="searches/rollout")
    axes[1].plot(steps, [h.get("kl", math.nan) for h in history], label="KL (k3)")
    axes[1].set_xlabel("step")
    axes[1].legend()
    evals = [h for h in history if "dev_em_all" in h]
    for key in sorted({k for h in evals for k in h if k.startswith("dev_em_")}):
        axes[2].plot([h["step"] for h in evals], [h.get(key, math.nan) for h in evals],
                     marker="o", label=key.removeprefix("dev_"))
    axes[2].set_xlabel("step")
    axes[2].set_title("greedy dev exact match")
    if evals:
        axes[2].legend()
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)
