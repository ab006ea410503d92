"""Every environment CI builds installs from a lock, and the test harness's teardown of a
server survives a server that died at start (CI's label-studio died at import)."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import REPO_ROOT
from tests.helpers import stop_process_group

PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)", re.M)


def _pins(lock: Path) -> dict[str, str]:
    return {m[1].lower().replace("_", "-"): m[2] for m in PIN.finditer(lock.read_text())}


def _name(req: str) -> str:
    return Requirement(req).name.lower().replace("_", "-")


def test_the_lock_pins_every_dependency_ci_installs() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("cpu", "dev", "ray"):
        wanted += project["optional-dependencies"][extra]
    pins = _pins(REPO_ROOT / "requirements/lock.txt")
    missing = sorted({_name(r) for r in wanted} - set(pins))
    assert not missing, f"requirements/lock.txt lacks {missing}: run `make lock`"
    for req in map(Requirement, wanted):
        assert req.specifier.contains(pins[_name(str(req))], prereleases=True), (
            f"requirements/lock.txt pins {req.name}=={pins[_name(str(req))]}, outside "
            f"pyproject.toml's {req}: run `make lock`")
    assert pins["torch"] == "2.13.0+cpu"


def test_the_steward_lock_keeps_a_sentry_sdk_that_label_studio_imports() -> None:
    pins = _pins(REPO_ROOT / "requirements/steward-lock.txt")
    assert pins["label-studio"] == "1.23.2"
    assert int(pins["sentry-sdk"].split(".")[0]) < 3


def test_the_makefile_installs_both_venvs_from_their_locks() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "-c $(LOCK)" in makefile and "LOCK := requirements/lock.txt" in makefile
    assert "-r $(STEWARD_LOCK)" in makefile
    assert "'label-studio==" not in makefile  # no unlocked install left


def test_stopping_a_server_that_died_at_start_raises_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"],
                            start_new_session=True)
    proc.wait(timeout=30)
    assert stop_process_group(proc) == []


def test_stopping_a_live_server_ends_its_whole_group() -> None:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \
           "'import time; time.sleep(300)']); time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    assert stop_process_group(proc, timeout_s=20) == []
    assert proc.returncode is not None
