"""Fingerprints of the code a result came from, so no cache outlives a code change.

`code_fingerprint(fn)` covers: the source of `fn` and of the helpers it calls in its own
module, every `searchrl` module those reach through imports (transitively, lazy imports
inside functions included, read from the files with `ast`), and the installed versions of the
packages that change results. Editing `rl/rewards.py` therefore changes the fingerprint of
every stage that rolls out, and of no stage that does not.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import inspect
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from searchrl.data.io import known_sha256

# Packages whose version can change a stage's numbers (models, kernels, tokenisers, indexes,
# contracts); the rest (prefect, mlflow, tqdm, ...) only change how a result is reported.
# (faiss-gpu installs as faiss-gpu-cu12: the `gpu` extra's distribution name.)
RESULT_PACKAGES = ("torch", "transformers", "tokenizers", "deepspeed", "bm25s", "faiss-cpu",
                   "faiss-gpu", "faiss-gpu-cu12", "sentence-transformers", "numpy",
                   "great-expectations", "vllm", "pydantic")


def package_versions(names: Iterable[str] = RESULT_PACKAGES) -> dict[str, str]:
    versions: dict[str, str] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def module_file(name: str) -> Path | None:
    """The source file of an importable module (None for namespace or missing modules)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _imported_names(path: Path, module: str, package: str) -> set[str]:
    """Modules under `package` that `module` (at `path`) imports anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    base_parts = module.split(".") if is_pkg else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base_parts[: len(base_parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # `from searchrl.rl import rewards` imports a module, not a name
            found.update(f"{target}.{a.name}" for a in node.names)
    return {n for n in found if n == package or n.startswith(package + ".")}


def import_closure(modules: Iterable[str], package: str = "searchrl") -> dict[str, Path]:
    """Every module of `package` reachable from `modules` through imports -> its file."""
    seen: dict[str, Path] = {}
    todo = [m for m in modules if m == package or m.startswith(package + ".")]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_file(name)
        if path is None:
            continue
        seen[name] = path
        # importing a.b.c runs a/__init__ and a/b/__init__ as well
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo.extend(p for p in parents if p not in seen)
        todo.extend(n for n in _imported_names(path, name, package) if n not in seen)
    return seen


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _function_roots(fn: Callable[..., Any], package: str) -> tuple[list[str], set[str]]:
    """(sources of fn and its same-module helpers, package modules the functions refer to)."""
    sources: list[str] = []
    modules: set[str] = set()
    todo: list[Callable[..., Any]] = [fn]
    done: set[int] = set()
    home = fn.__module__
    while todo:
        f = todo.pop()
        if id(f) in done:
            continue
        done.add(id(f))
        sources.append(inspect.getsource(f))
        code = getattr(f, "__code__", None)
        if code is None:
            continue
        for name in sorted(_code_names(code)):
            obj = f.__globals__.get(name)  # type: ignore[attr-defined]
            if obj is None:
                continue
            if isinstance(obj, types.ModuleType):
                mod = obj.__name__
            else:
                mod = getattr(obj, "__module__", None) or ""
            if mod == home and inspect.isfunction(obj):
                todo.append(obj)
            elif mod == home and inspect.isclass(obj):
                sources.append(inspect.getsource(obj))
                todo.extend(v for v in vars(obj).values() if inspect.isfunction(v))
            elif mod == package or mod.startswith(package + "."):
                modules.add(mod)
    return sources, modules


def code_fingerprint(fn: Callable[..., Any], package: str = "searchrl") -> str:
    """sha256 over `fn`'s own code, the package modules it reaches, and result packages."""
    sources, roots = _function_roots(fn, package)
    closure = import_closure(roots, package)
    h = hashlib.sha256()
    for source in sources:
        h.update(source.encode())
    for name in sorted(closure):
        h.update(f"\n{name}={known_sha256(closure[name])}".encode())
    for name, version in sorted(package_versions().items()):
        h.update(f"\n{name}=={version}".encode())
    return h.hexdigest()
