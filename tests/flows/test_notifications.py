"""Notifications arrive: the automations in prefect-automations.yaml, installed by
flows/automations.py on Prefect's test server with a webhook channel, send a local HTTP
receiver a message (run name, decision or state, report link) for a NO-GO, a run failed
outside its stages, a crashed run, quarantine over threshold and gold-set drift. The test
server runs Prefect's triggers and actions services (they run in ephemeral servers too), so
the automations act as on a real server, within a second or two."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.settings import PREFECT_API_URL

from flows.automations import AUTOMATIONS_FILE, ROOT, load_automations, main
from searchrl.config import PipelineConfig
from searchrl.types import Decision
from searchrl.validation.validate import QuarantineThresholdError
from tasks.events import REPORTS_URL_ENV, publish_decision
from tasks.validate import validate_gold_labels
from tests.contracts.conftest import DEFECTS, make_defects_config
from tests.contracts.test_drift import _config as drift_config
from tests.contracts.test_drift import _edit_world
from tests.flows.test_events import _events

pytestmark = pytest.mark.usefixtures("prefect_harness")
NAMES = [a.name for a in load_automations(AUTOMATIONS_FILE, UUID(int=0))]


class Receiver:
    """A webhook endpoint on 127.0.0.1 that keeps every JSON body posted to it."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer._changed:
                    outer.messages.append(json.loads(body or b"{}"))
                    outer._changed.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, match: Callable[[dict[str, Any]], bool],
                 timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                found = [m for m in self.messages if match(m)]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                assert left > 0, f"no matching message in {timeout_s} s; got {self.messages}"
                self._changed.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """The receiver, with the automations installed to post to it (twice: idempotent);
    removed again afterwards, so other tests' events notify nobody."""
    hook = Receiver()
    try:
        assert main(["--url", hook.url]) == 0
        assert main(["--url", hook.url]) == 0
        yield hook
    finally:
        with get_client(sync_client=True) as client:
            for name in NAMES:
                for automation in client.read_automations_by_name(name):
                    client.delete_automation(automation.id)
        hook.close()


def _about(run: str, what: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: f"searchrl {run}: {what}" in m.get("subject", "")


def test_installing_twice_leaves_one_of_each(receiver: Receiver,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with get_client(sync_client=True) as client:
        found = {name: client.read_automations_by_name(name) for name in NAMES}
    assert {n: len(a) for n, a in found.items()} == dict.fromkeys(NAMES, 1)
    assert set(NAMES) == {"searchrl-no-go", "searchrl-run-failed", "searchrl-run-lost",
                          "searchrl-data"}
    assert all(a[0].enabled for a in found.values())


def test_bad_file_or_no_channel_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "automations.yaml"
    bad.write_text("automations:\n  - name: x\n    trigger: {type: event, posture: Sideways}\n"
                   "    actions: []\n")
    assert main(["--file", str(bad), "--dry-run"]) == 2
    assert "automations.yaml: automation 1 ('x'): field 'trigger" in capsys.readouterr().err
    monkeypatch.delenv("SEARCHRL_NOTIFY_URL", raising=False)
    assert main([]) == 2
    assert "no channel: set $SEARCHRL_NOTIFY_URL" in capsys.readouterr().err
    assert main(["--url", "http://x", "--channel", "pigeon"]) == 2
    assert "'pigeon' is not one of" in capsys.readouterr().err


def test_no_go_arrives_with_reasons_and_report_link(receiver: Receiver, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "run"
    report = work / "gate" / "report.html"
    report.parent.mkdir(parents=True)
    report.write_text("<html></html>")
    monkeypatch.setenv(REPORTS_URL_ENV, "https://reports.example/searchrl/")
    config = PipelineConfig.model_validate({"run": {"name": "notify-no-go",
                                                    "work_dir": str(work)}})
    decision = Decision(go=False, reasons=("trained EM not above scripted",),
                        report_html=str(report))

    @flow
    def decide() -> None:
        publish_decision(config, decision)

    decide()
    message = receiver.wait_for(_about("notify-no-go", "NO-GO"))
    assert "Run notify-no-go: decision NO-GO" in message["body"]
    assert "Reasons: trained EM not above scripted" in message["body"]
    assert "Report: https://reports.example/searchrl/gate/report.html" in message["body"]
    assert message["source"] == "searchrl-notify"


def test_failure_outside_the_stages_arrives(receiver: Receiver, tmp_path: Path) -> None:
    """The real pipeline flow, its tracking store unreachable: it fails before any stage."""
    from flows.pipeline import pipeline

    overrides = ["run.name=notify-failed", f"run.work_dir={tmp_path / 'run'}",
                 "tracking.tracking_uri=http://127.0.0.1:9", "tracking.connect_timeout_s=1"]
    with pytest.raises(Exception, match=r"127\.0\.0\.1:9"):
        pipeline(config_path="configs/tiny.yaml", overrides=overrides)
    message = receiver.wait_for(_about("notify-failed", "Failed"))
    assert "127.0.0.1:9" in message["body"] and "the champion stays" in message["body"]


def test_crashed_run_arrives(receiver: Receiver) -> None:
    """A run ended by SIGTERM (flows/pipeline.py turns it into SystemExit) is Crashed."""

    @flow(name="searchrl-pipeline", flow_run_name="notify-crashed")
    def killed() -> None:
        raise SystemExit(143)

    with pytest.raises(SystemExit):
        killed()
    message = receiver.wait_for(_about("notify-crashed", "Crashed"))
    assert "Run notify-crashed: Crashed" in message["body"]


@flow
def _validate(config: PipelineConfig) -> None:
    validate_gold_labels(config, None, None)


def test_quarantine_over_threshold_arrives(receiver: Receiver, tmp_path: Path) -> None:
    with pytest.raises(QuarantineThresholdError):
        _validate(make_defects_config(tmp_path, max_quarantine_fraction=0.01))
    quarantine = receiver.wait_for(
        _about("defects", "searchrl.quarantine.over-threshold"))
    assert "validate.max_quarantine_fraction=0.01" in quarantine["body"]
    assert "Report: file://" in quarantine["body"]
    assert "audit_report.html" in quarantine["body"]


@pytest.mark.slow  # two validations, ~10 s
def test_drift_warning_arrives(receiver: Receiver, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(DEFECTS, data)
    _validate(drift_config(tmp_path, data))  # the reference gold set: no drift to tell
    _edit_world(data)
    _validate(drift_config(tmp_path, data, drift_warn_fraction=0.2))
    drift = receiver.wait_for(_about("drift", "searchrl.data.drift"))
    assert "qa 'train'" in drift["body"] and "drift_warn_fraction=0.2" in drift["body"]
    assert "audit_report.html" in drift["body"]


SCRIPT = """
import sys, time
from prefect import flow
sys.path.insert(0, {root!r})
from searchrl.exit_codes import exit_on_sigterm
exit_on_sigterm()  # as flows/pipeline.py's main() does

@flow(name="searchrl-pipeline", flow_run_name={name!r})
def weekly() -> None:
    print("running", flush=True)
    time.sleep(600)

weekly()
"""
# The lost-run test's timing, scaled down from the deployments' (a heartbeat a minute, a
# 600 s window): Prefect's shortest heartbeat, and a window one beat plus 20 s long (the
# events' way to the server and the triggers' 5 s evaluation fit in it), so a live run's next
# beat always comes in time and a killed run's never does.
BEAT_S = 30
WINDOW_S = BEAT_S + 20


def _start(tmp_path: Path, name: str) -> subprocess.Popen[str]:
    """A `searchrl-pipeline` flow in its own process against the test server, sending a
    heartbeat every BEAT_S."""
    script = tmp_path / f"{name}.py"
    script.write_text(SCRIPT.format(root=str(ROOT), name=name))
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
           "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(BEAT_S)}
    return subprocess.Popen([sys.executable, str(script)], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _until_running(proc: subprocess.Popen[str]) -> subprocess.Popen[str]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "running":
            return proc
    raise AssertionError(f"the flow never ran (exit {proc.wait()})")


def _run_until_running(tmp_path: Path, name: str) -> subprocess.Popen[str]:
    return _until_running(_start(tmp_path, name))


@pytest.mark.slow  # a process of its own (~10 s)
def test_sigterm_crash_arrives(receiver: Receiver, tmp_path: Path) -> None:
    proc = _run_until_running(tmp_path, "notify-sigterm")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    message = receiver.wait_for(_about("notify-sigterm", "Crashed"))
    assert "Run notify-sigterm: Crashed" in message["body"]


def _heartbeats(name: str) -> int:
    return len(_events("prefect.flow-run.heartbeat",
                       lambda e: e.resource.get("prefect.resource.name") == name))


def _state(name: str) -> str:
    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    assert run.state is not None
    return run.state.type.value


@pytest.mark.slow  # outlives a heartbeat window and a beat (~90 s)
def test_killed_run_is_marked_crashed_and_a_live_one_is_not(receiver: Receiver,
                                                             tmp_path: Path) -> None:
    """SIGKILL (what the OOM killer sends): nothing marks the run ended but the heartbeat
    automation, installed here with a WINDOW_S window instead of 10 minutes. Beside it a run
    that stays alive, watched past a window and a beat: its heartbeats keep it Running, and
    no one is told it was lost."""
    quick = tmp_path / "automations.yaml"
    quick.write_text(AUTOMATIONS_FILE.read_text().replace("within: 600", f"within: {WINDOW_S}"))
    assert main(["--url", receiver.url, "--file", str(quick)]) == 0
    doomed, alive = _start(tmp_path, "notify-oom"), _start(tmp_path, "notify-alive")
    try:
        _until_running(doomed)
        _until_running(alive)
        alive_since = time.monotonic()
        assert _heartbeats("notify-oom"), "the run sent no heartbeat"
        doomed.kill()
        doomed.wait(timeout=30)
        message = receiver.wait_for(_about("notify-oom", "Crashed"), timeout_s=WINDOW_S + 90)
        assert "no heartbeat for 10 minutes" in message["body"]

        time.sleep(max(0.0, alive_since + WINDOW_S + BEAT_S + 10 - time.monotonic()))
        assert alive.poll() is None
        assert _heartbeats("notify-alive") >= 2
        assert _state("notify-alive") == "RUNNING"
        assert not [m for m in receiver.messages if "notify-alive" in m.get("subject", "")]
    finally:
        for proc in (doomed, alive):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # Crashed by its own hand, not left Running
                proc.wait(timeout=60)
        assert main(["--url", receiver.url]) == 0
