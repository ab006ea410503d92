"""Layering rules from DESIGN.md, enforced: the library never imports prefect; only
searchrl/tracking.py imports mlflow."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "searchrl"


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_library_never_imports_prefect() -> None:
    offenders = [p for p in SRC.rglob("*.py") if "prefect" in _imported_roots(p)]
    assert offenders == []


def test_only_tracking_imports_mlflow() -> None:
    offenders = [p.relative_to(SRC) for p in SRC.rglob("*.py")
                 if "mlflow" in _imported_roots(p) and p.name != "tracking.py"]
    assert offenders == []
    assert "mlflow" in _imported_roots(SRC / "tracking.py")


def test_the_rule_checker_sees_imports(tmp_path: Path) -> None:
    # Guards the guard: imports nested in functions and dotted imports are still caught.
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import prefect.tasks\n    from mlflow import log_metric\n")
    assert {"prefect", "mlflow"} <= _imported_roots(probe)
