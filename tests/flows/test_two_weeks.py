"""The weekly loop end to end (scripts/weeks.py, searchrl/simulation/).

Two weeks of the local deployment (`--weeks 2`) on a real Prefect server, a process worker and
a real MLflow sqlite store: a steward's correction and new data between the weeks re-run
validation and training, the corrected label reaches the model, the drift report sees the new
rows and passages, the registry records the challenger and its decision, rollback moves the
champion back, and the decision artifact and events of both runs are in the API.

Six weeks with faults (the CI-sized year): a week with no change runs no stage; a malformed
gold file, a run killed mid-training and a retriever that is down each fail loudly (their exit
code and message) and the next attempt or week recovers; every row is accounted for, and
retention keeps the registry and the work dir bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.test_pipeline_flow import FAST

ROOT = Path(__file__).resolve().parents[2]
# Run from another checkout (a worktree), the scripts import that checkout's library.
PYTHONPATH = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


def prefect_processes(prefect_home: Path, wait_s: float = 10.0, command: str = "prefect"
                      ) -> list[str]:
    """Command lines holding `command` (Prefect servers and workers by default) still running
    with this home (a worker ignored deploy_smoke.sh's first SIGTERM and polled on, and took
    the next week's run)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if f"PREFECT_HOME={prefect_home}".encode() in env and command in cmd:
                found.append(cmd)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def script_env(tmp_path: Path) -> dict[str, str]:
    """The weeks script's environment: offline, CPU, Prefect's home under tmp_path/prefect."""
    bin_dir = Path(sys.executable).parent
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PREFECT_HOME": str(tmp_path / "prefect"),
            "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false", **PYTHONPATH}


@pytest.mark.slow
def test_two_weeks_of_the_local_deployment(tmp_path: Path) -> None:
    figures_path = tmp_path / "two_weeks.json"
    proc = subprocess.run(
        [sys.executable, "scripts/weeks.py", "--weeks", "2", "--data", str(tmp_path / "data"),
         "--json", str(figures_path), *FAST],
        cwd=ROOT, capture_output=True, text=True, timeout=3000,
        env=script_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert prefect_processes(tmp_path / "prefect") == []  # no worker or server left behind
    fig = json.loads(figures_path.read_text())
    week1, week2 = fig["weeks"]
    assert week1["state"] == week2["state"] == "COMPLETED"

    # Week 1 ran every stage; week 2 re-ran validation and training, and says why.
    assert len(week1["stages_ran"]) == 6
    assert {"validate_gold_labels", "train_policy"} <= set(week2["stages_ran"])
    assert week2["why"]["validate_gold_labels"] == ["its data files changed",
                                                    "its stewards' overrides changed"]
    assert ("input validate_gold_labels changed (changed parts: corpus, train)"
            in week2["why"]["train_policy"])

    # The steward's correction and acceptance went through apply-audit and reached the model.
    steward = fig["steward"]
    assert [d["decision"] for d in steward["decisions"]] == ["correct", "accept"]
    assert steward["apply_audit"]["added"][0] == steward["corrected_id"]
    assert len(steward["apply_audit"]["added"]) == 2
    reached = fig["reached_the_model"]
    assert reached["corrected_in_train_split"], reached
    assert reached["week2_train_answers"] == steward["corrected_answers"]
    # The curriculum estimated it with the corrected gold (kept for GRPO, or dropped saying why)
    assert reached["week2_curriculum"]["answers"] == steward["corrected_answers"]
    assert reached["cold_start_rebuilt"] and reached["training_reran"]

    # Drift against week 1's gold set: the new rows, the corrected answer, revised passages.
    sets = fig["drift"]["sets"]
    assert sets["qa:train"]["added"] == len(fig["data_changes"]["rows_added"]) > 0
    assert sets["qa:train"]["changed"] >= 1
    assert sets["corpus:corpus"]["changed"] == len(fig["data_changes"]["passages_changed"]) > 0

    # The registry: every gate run registers a challenger tagged with its decision.
    labels = ["GO" if w["decision"]["go"] else "NO-GO" for w in (week1, week2)]
    reg = fig["registry_after_week2"]
    assert reg["challenger"] == {"version": "2", "decision": labels[1]}
    if labels == ["GO", "GO"]:  # week 2 replaced week 1's champion; rollback restores it
        assert reg["champion"]["version"] == "2" and reg["previous-champion"]["version"] == "1"
        assert fig["rollback"]["done"], fig["rollback"]
        assert fig["registry_after_rollback"]["champion"]["version"] == "1"
    else:  # FAST trains for minutes: the policy answers nothing, the gate says NO-GO (the
        # accuracy interval cannot exclude zero) and there is no earlier champion to restore
        assert fig["rollback"] == {"done": False, "exit_code": 11,
                                   "message": fig["rollback"]["message"]}
        assert "previous-champion" in fig["rollback"]["message"]
        assert fig["registry_after_rollback"] == reg

    # Prefect: the decision artifact of each run and its decision event, read from the server;
    # apply-audit's gold-set event, posted outside the runs.
    prefect = fig["prefect"]
    for week, label in zip(("week1", "week2"), labels, strict=True):
        assert prefect["artifacts"][week]["headline"].endswith(f" {label}: tiny")
        assert any(e.startswith(f"searchrl.decision.{label.lower()} ")
                   for e in prefect["events"][week])
    assert any(e.startswith("searchrl.gold-set.updated")
               for e in prefect["events"]["outside the runs"])
    assert fig["week2_over_week1"] > 0


SIX_WEEKS = {2: "no_change", 3: "malformed_gold", 4: "killed_mid_training", 5: "retriever_down"}


@pytest.mark.slow
def test_six_weeks_with_faults_fail_loudly_and_recover(tmp_path: Path) -> None:
    figures_path = tmp_path / "weeks.json"
    proc = subprocess.run(
        [sys.executable, "scripts/weeks.py", "--weeks", "6", "--data", str(tmp_path / "data"),
         "--json", str(figures_path), "--plot", str(tmp_path / "weeks.png"),
         "--table", str(tmp_path / "weeks.md"),
         *(f"--fault={w}:{name}" for w, name in SIX_WEEKS.items()),
         *FAST, "data.synthetic.n_train=70", "train.sft.n_demos=8",
         "retention.keep_weeks=2", "retention.keep_challengers=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=3000,
        env=script_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert prefect_processes(tmp_path / "prefect") == []
    fig = json.loads(figures_path.read_text())
    weeks = {w["week"]: w for w in fig["weeks"]}
    stages_run = {n: sum(len(r["stages"]) for r in w["runs"]) for n, w in weeks.items()}
    assert weeks[1]["completed"] and stages_run[1] == 6
    # Nothing changed: every stage came from the cache, at a fraction of week 1's time (at
    # these sizes a flow process's fixed cost is most of a week: 0.46-0.63x over 52 weeks,
    # docs/results/weeks.md; the bound leaves room for a loaded CI machine).
    assert weeks[2]["completed"] and stages_run[2] == 0
    assert weeks[2]["seconds"] < 0.75 * weeks[1]["seconds"]
    # The malformed train file fails validation with its code and names the file.
    bad = weeks[3]["attempts"][-1]
    assert not weeks[3]["completed"] and bad["exit_code"] in (4, 5, 6), bad
    assert "train.jsonl" in bad["message"], bad
    # Killed mid-training (SIGTERM: 143), then the same week again completes, the file restored.
    killed, rerun = weeks[4]["attempts"]
    assert killed["killed"] and killed["exit_code"] == 143, killed
    assert rerun["exit_code"] == 0 and weeks[4]["completed"] and weeks[4]["restored_gold_file"]
    assert "train_policy" in weeks[4]["runs"][-1]["stages"]
    # The retriever is down: the stage that searches fails with the service's code; next week
    # recovers with the changes of both weeks.
    down = weeks[5]["attempts"][-1]
    assert not weeks[5]["completed"] and down["exit_code"] == 7, down
    assert weeks[6]["completed"] and "filter_curriculum" in weeks[6]["runs"][-1]["stages"]
    # Every row accounted for in every week whose validation ran, the steward in every
    # changed week after the first.
    for n in (1, 2, 4, 6):
        assert weeks[n]["quarantine"]["accounted"], weeks[n]["quarantine"]
    assert all(weeks[n]["steward"]["apply_audit"]["added"] for n in (3, 4, 5, 6))
    # Retention (keep_weeks=2, keep_challengers=1): at most the newest version plus the aliased.
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'data' / 'mlflow.db'}"
    versions = MlflowClient(tracking_uri=uri).search_model_versions("name = 'searchrl-tiny'")
    assert 1 <= len(versions) <= 3
    superseded = list((tmp_path / "data" / "work" / "train_policy").glob(
        "checkpoints.superseded-*"))
    assert len(superseded) <= 2
    # The server's own record of each attempt.
    states = fig["prefect"]["states"]
    assert states["week1/0"] == "COMPLETED" and states["week3/0"] in ("FAILED", "CRASHED")
    assert (tmp_path / "weeks.png").stat().st_size > 0


@pytest.mark.slow
def test_sigterm_to_the_weeks_script_stops_its_prefect_server(tmp_path: Path) -> None:
    home = tmp_path / "prefect"
    proc = subprocess.Popen(
        [sys.executable, "scripts/weeks.py", "--weeks", "3", "--data", str(tmp_path / "data"),
         *FAST],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=script_env(tmp_path),
    )
    try:
        # Once the first week's flow runs, the script's server answers.
        deadline = time.monotonic() + 300
        while not list((tmp_path / "data").glob("logs/week001.log")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            time.sleep(0.5)
        assert prefect_processes(home, wait_s=0), "the script's server is not running"
        proc.terminate()
        assert proc.wait(120) == 143
    finally:
        proc.kill()
    assert prefect_processes(home) == []
    # Nor the week's flow process (it runs in its own session, with the script's env).
    assert prefect_processes(home, wait_s=0, command="pipeline.py") == []
