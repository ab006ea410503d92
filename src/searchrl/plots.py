"""Saving matplotlib figures.

Figures are built with `matplotlib.figure.Figure` directly, never pyplot: pyplot keeps global
state (current figure, backend) that is unsafe in Prefect worker threads and leaks figures.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

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
