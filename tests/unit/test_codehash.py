"""Stage code fingerprints: a stage's key moves when code it reaches changes, and only then."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from searchrl.codehash import code_fingerprint, import_closure


@pytest.fixture
def package(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "pkgx"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    # stage -> helper (top-level import) -> deep (lazy import inside a function)
    (root / "stage.py").write_text(
        "from pkgx.helper import helper\n\n\ndef run():\n    return _local() + helper()\n\n\n"
        "def _local():\n    return 1\n\n\ndef other():\n    from pkgx import unrelated\n"
        "    return unrelated.X\n")
    (root / "helper.py").write_text(
        "def helper():\n    from .sub import deep\n    return deep.VALUE\n")
    (root / "sub" / "deep.py").write_text("VALUE = 1\n")
    (root / "unrelated.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    yield root
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m == "pkgx" or m.startswith("pkgx.")]:
        del sys.modules[name]


def _fingerprint() -> str:
    importlib.invalidate_caches()
    stage = importlib.import_module("pkgx.stage")
    return code_fingerprint(stage.run, package="pkgx")


def test_closure_follows_lazy_and_relative_imports(package: Path) -> None:
    assert set(import_closure(["pkgx.helper"], "pkgx")) == {
        "pkgx", "pkgx.helper", "pkgx.sub", "pkgx.sub.deep"}


def test_editing_a_reached_module_changes_the_fingerprint(package: Path) -> None:
    before = _fingerprint()
    assert _fingerprint() == before  # stable
    (package / "unrelated.py").write_text("X = 2  # not reached by run()\n")
    assert _fingerprint() == before
    (package / "sub" / "deep.py").write_text("VALUE = 2\n")
    assert _fingerprint() != before


def test_editing_a_helper_in_the_stage_module_changes_it(package: Path) -> None:
    before = _fingerprint()
    stage = package / "stage.py"
    stage.write_text(stage.read_text().replace("return 1", "return 2"))
    for name in [m for m in sys.modules if m.startswith("pkgx")]:
        del sys.modules[name]
    assert _fingerprint() != before


def test_the_cold_start_fingerprint_reaches_demo_sft_and_model_code() -> None:
    """The cold start is reused by key: its code part must move when the demo builder, its
    BM25 searcher, SFT or the model code changes, all outside cold_start's own module."""
    from searchrl.codehash import _function_roots
    from searchrl.train.cold_start.build import cold_start

    sources, roots = _function_roots(cold_start, "searchrl")
    assert {"searchrl.train.cold_start.demos", "searchrl.train.cold_start.sft",
            "searchrl.models.tiny",
            "searchrl.retrieval.bm25", "searchrl.retrieval.index_store",
            "searchrl.train.seeds"} <= import_closure(roots).keys()
    # Its helpers in cold_start.py are hashed by their source.
    for helper in ("_demonstrations", "bm25_searcher", "information_block",
                   "extra_world_seeds", "demo_kwargs"):
        assert any(f"def {helper}(" in s for s in sources), helper
