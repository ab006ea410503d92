"""Layering rules from docs/DESIGN.md, enforced: the library never imports prefect (nor the
flows and tasks above it); mlflow is imported by searchrl/tracking.py alone, and no other
library module pulls it in, directly or through the modules it imports (every DeepSpeed rank
and the retrieval service import the library)."""

from __future__ import annotations

import ast
import json
import re
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


# --- the package import graph


def _package_graph(root: Path, package: str | None = None) -> dict[str, set[str]]:
    """Package-level imports under `root` (the `searchrl` package directory, or one of its
    packages, dotted `package`): node = a subpackage or a top-level module; an edge where any
    module of one imports (anywhere in its body, lazily included) a module of the other."""
    prefix = (package or root.name).split(".")
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts == ("__init__",):
            continue
        source = parts[0]
        targets = graph.setdefault(source, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                dotted = name.split(".")
                n = len(prefix)
                if dotted[:n] == prefix and len(dotted) > n and dotted[n] != source:
                    targets.add(dotted[n])
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_library_packages_import_each_other() -> None:
    # e.g. retrieval importing rl.prompts for the tag helpers while rl.rollout imports
    # retrieval.base: those helpers live in searchrl/tags.py, below both.
    graph = _package_graph(SRC)
    assert _cycles(graph) == []
    assert {"retrieval", "rl", "tags"} <= set(graph) and "tags" in graph["retrieval"]


def test_the_cycle_checker_sees_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    root = tmp_path / "searchrl"
    for package, text in (("a", "from searchrl.b.x import f\n"),
                          ("b", "def f():\n    import searchrl.c\n"),
                          ("c", "from searchrl.a import y\n")):
        (root / package).mkdir(parents=True)
        (root / package / "x.py").write_text(text)
    (root / "top.py").write_text("from searchrl.a.x import z\n")
    assert _cycles(_package_graph(root)) == [["a", "b", "c"]]


def _module_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module-level imports inside one package (lazy ones included): node = a module of it."""
    dotted_package = ".".join(package_dir.relative_to(SRC.parent).parts)
    graph: dict[str, set[str]] = {}
    for path in sorted(package_dir.glob("*.py")):
        targets = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                rest = name.removeprefix(dotted_package + ".")
                if rest != name and "." not in rest and rest != path.stem:
                    targets.add(rest)
    return graph


def test_no_import_circle_inside_train() -> None:
    # The trainer's state, its update and its checkpoint selection each read without the others
    # (issue 34): state.py holds the records, update.py and selection.py read only it.
    graph = _module_graph(SRC / "train" / "grpo")
    assert _cycles(graph) == []
    assert "state" in graph["update"] and "state" in graph["selection"]
    assert not graph["update"] & {"selection", "trainer"}
    assert not graph["selection"] & {"update", "trainer"}


def test_train_is_grouped_by_concern_one_way() -> None:
    # train/ (issue 45): the stage and its start on top; GRPO over the cold start it starts
    # from; the ranks' plumbing (DeepSpeed, its launcher) and the shared seeds and tensors at
    # the bottom, importing none of the others.
    graph = _package_graph(SRC / "train", "searchrl.train")
    assert _cycles(graph) == []
    assert {"cold_start", "grpo", "distributed", "rejection_sampling", "stage", "start",
            "seeds", "tensors"} == set(graph)
    assert "cold_start" in graph["grpo"] and "distributed" in graph["grpo"]
    assert graph["cold_start"] <= {"seeds", "tensors"}
    assert graph["distributed"] == graph["seeds"] == graph["tensors"] == set()


def test_every_file_with_slow_tests_runs_in_ci() -> None:
    # The default run skips slow tests; CI's slow steps name their files one by one, so a
    # new slow test in a file no step names would never run anywhere.
    root = SRC.parents[1]
    ci_script = (root / ".ci" / "run").read_text()
    slow_files = sorted(
        str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
        if re.search(r"pytest\.mark\.slow\b", p.read_text())
    )
    assert slow_files, "no slow test found: the marker's spelling changed?"
    missing = [f for f in slow_files if f not in ci_script]
    assert missing == [], f"slow tests that CI never runs: {missing}"


# --- the train stage reads top down (issue 45; docs/DESIGN.md "The train stage's walk")


def test_the_train_stage_reads_top_down() -> None:
    # The config's trip from the train stage (tests/call_walk.py): it goes back up a layer
    # at most 12 times, never re-enters stages.py, and enters cold_start/build.py at most twice
    # (the start prepared once; PPO-ptx's demonstration helpers).
    from searchrl import stages
    from searchrl.config import load_config
    from tests.call_walk import figures, walk

    events = walk(stages.train_policy, load_config(SRC.parents[1] / "configs" / "tiny.yaml"))
    reached = {f"{e.module}:{e.function}" for e in events}
    assert {"searchrl.train.start:prepare_start", "searchrl.train.grpo.trainer:train_policy_run",
            "searchrl.train.cold_start.build:cold_start",
            "searchrl.train.distributed.launcher:launch_ranks",
            "searchrl.train.rejection_sampling:build_rejection_sampling"} <= reached  # a real walk
    walked = figures(events)
    assert walked.climbs <= 12
    assert "searchrl.stages" not in walked.visits
    assert walked.visits["searchrl.train.cold_start.build"] <= 2


def test_references_sit_below_every_stage() -> None:
    # refs.py reads, writes and locks references for stages.py and train/stage.py alike: it
    # imports neither (nor any stage's package), and names each reference's stage as
    # STAGES does.
    from searchrl.codehash import import_closure
    from searchrl.refs import PRODUCERS
    from searchrl.stages import STAGES

    below = set(import_closure(["searchrl.refs"]))
    assert not {m for m in below if m == "searchrl.stages" or m.startswith(
        ("searchrl.train", "searchrl.eval", "searchrl.gate", "searchrl.curriculum"))}
    assert {s.output_kind(): name for name, s in STAGES.items()} == PRODUCERS
