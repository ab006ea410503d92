"""Saving matplotlib figures.

Figures are built with `matplotlib.figure.Figure` directly, never pyplot: pyplot keeps global
state (current figure, backend) that is unsafe in Prefect worker threads and leaks figures.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from searchrl.datasets.io import atomic_write_bytes

# One colour per evaluated system in every plot of a report: the known systems pinned (so the
# same system looks the same across reports too), any other name a spare colour in the order
# it is first seen. Plots that colour by position gave `trained` a different colour wherever a
# plot showed a subset of the systems (issue 25, item 3b).
SYSTEM_COLORS: dict[str, str] = {
    "no_search": "tab:blue", "retrieve_once": "tab:orange", "sft": "tab:green",
    "trained": "tab:red", "frontier": "tab:purple", "champion": "tab:brown",
}
_SPARE_COLORS = ("tab:pink", "tab:olive", "tab:cyan", "tab:gray")


def system_colors(names: Iterable[str]) -> dict[str, str]:
    """System name -> matplotlib colour for every name in `names` (pass all systems a report
    shows, in display order, and use the result for every plot)."""
    colors: dict[str, str] = {}
    spare = 0
    for name in names:
        if name in colors:
            continue
        if name in SYSTEM_COLORS:
            colors[name] = SYSTEM_COLORS[name]
        else:
            colors[name] = _SPARE_COLORS[spare % len(_SPARE_COLORS)]
            spare += 1
    return colors


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
    where measured (the start's, step 0, included: its row has no training figures)."""
    evals = [h for h in history if "dev_em_all" in h]
    history = [h for h in history if "reward_mean" in h]
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
    if any("ptx_nll" in h for h in history):  # train.ptx_coef: the replayed demos' NLL
        axes[1].plot(steps, [h.get("ptx_nll", math.nan) for h in history],
                     label="replay NLL (PPO-ptx)")
    axes[1].set_xlabel("step")
    axes[1].legend()
    for key in sorted({k for h in evals for k in h if k.startswith("dev_em_")}):
        axes[2].plot([h["step"] for h in evals], [h.get(key, math.nan) for h in evals],
                     marker="o", label=key.removeprefix("dev_"))
    axes[2].set_xlabel("step")
    axes[2].set_title("greedy dev exact match")
    if evals:
        axes[2].legend()
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)
