"""Layering rules from docs/DESIGN.md, enforced: the library never imports prefect (nor the
flows and tasks above it); mlflow is imported by searchrl/tracking.py alone, and no other
library module pulls it in, directly or through the modules it imports (every DeepSpeed rank
and the retrieval service import the library)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "searchrl"
# The one module that may import mlflow at import time (others import it lazily, where needed).
TRACKING_USERS = {"tracking"}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def _modules() -> list[str]:
    names = []
    for p in sorted(SRC.rglob("*.py")):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_library_never_imports_prefect_flows_or_tasks() -> None:
    offenders = [p for p in SRC.rglob("*.py")
                 if {"prefect", "flows", "tasks"} & _imported_roots(p)]
    assert offenders == []


def test_only_tracking_imports_mlflow() -> None:
    offenders = [p.relative_to(SRC) for p in SRC.rglob("*.py")
                 if "mlflow" in _imported_roots(p) and p.name != "tracking.py"]
    assert offenders == []
    assert "mlflow" in _imported_roots(SRC / "tracking.py")


def test_no_library_module_pulls_in_mlflow_or_prefect_transitively() -> None:
    # A fresh interpreter imports every library module but tracking; whatever they import at
    # module level, directly or through each other, lands in sys.modules.
    modules = [m for m in _modules() if m.rsplit(".", 1)[-1] not in TRACKING_USERS
               and m != "searchrl.generation.vllm"]  # needs the optional gpu extra
    probe = ("import importlib, json, sys\n"
             "culprits = []\n"
             f"for m in {modules!r}:\n"
             "    had = 'mlflow' in sys.modules or 'prefect' in sys.modules\n"
             "    importlib.import_module(m)\n"
             "    if not had and ('mlflow' in sys.modules or 'prefect' in sys.modules):\n"
             "        culprits.append(m)\n"
             "print(json.dumps(culprits))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=300).stdout.splitlines()
    assert json.loads(out[-1]) == []  # the first module whose import brought either in
    assert len(modules) > 40  # the probe really imported the library


def test_the_rule_checker_sees_imports(tmp_path: Path) -> None:
    # Guards the guard: imports nested in functions and dotted imports are still caught.
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import prefect.tasks\n    from mlflow import log_metric\n")
    assert {"prefect", "mlflow"} <= _imported_roots(probe)


GENERATORS = {"HFGenerator", "HFFullContextGenerator", "VLLMGenerator",
              "OpenAICompatGenerator"}


def _generator_uses(path: Path) -> list[str]:
    """Names of generator classes `path` mentions, and generation backend modules it imports."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id in GENERATORS:
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in GENERATORS:
            found.append(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module in (
                "searchrl.generation.hf", "searchrl.generation.vllm"):
            found.append(node.module)
    return found


def test_every_stage_gets_its_generator_from_the_factory() -> None:
    # Curriculum estimation, training rollouts, the dev curve and evaluation must honour the
    # same run.device / model.dtype / rollout.backend: only generation/factory.py builds one.
    root = SRC.parents[1]
    offenders = {str(p.relative_to(root)): _generator_uses(p)
                 for p in [*SRC.rglob("*.py"), *(root / "tasks").glob("*.py"),
                           *(root / "flows").glob("*.py")]
                 if p.parent != SRC / "generation" and _generator_uses(p)}
    assert offenders == {}


def test_the_generator_rule_sees_a_direct_construction(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f(m, t):\n    from searchrl.generation.hf import HFGenerator\n"
                     "    return HFGenerator(m, t)\n")
    assert "HFGenerator" in _generator_uses(probe)
