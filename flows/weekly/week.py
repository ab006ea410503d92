"""One week through the real flow, and what it left behind.

A week runs `flows/pipeline.py` either through prefect.yaml's `searchrl-tiny-local`
deployment and a process worker (`run_deployment`: scripts/deploy_smoke.sh, as users run it)
or as the flow's own process against a Prefect server kept for all weeks (`run_flow`: the
same flow and storage, without a deploy and a worker per week, and a process a simulation can
kill mid-training). Both read the world's files and keep their stage cache in
DIR/prefect-results, their work dir in DIR/work and MLflow in DIR/mlflow.db.

The rest reads a week's record back: each stage's reference and cache-key parts (and so why a
stage re-ran), the stages that ran (MLflow child runs), the decision, the registry, the
validation's quarantine and drift, the Prefect artifacts and events, and the disk used.

Over 400 lines because a week's record reads every store a run writes (work dir, MLflow,
the registry, Prefect); each reader is a short function used by `simulate` alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from searchrl.retention import disk_bytes
from searchrl.simulation.world import read_rows

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/tiny.yaml"
RUN_LINE = re.compile(r"^run (\S+) (\S+) start=(\S+) end=(\S+) waited_for_slot=[01]$", re.M)


def weekly_env(data: Path, port: int) -> dict[str, str]:
    """The environment every command of the weeks runs in: one Prefect home and server, the
    stage cache in DIR/prefect-results (where the local deployment keeps it), offline hubs."""
    env = dict(os.environ) | {
        "PREFECT_HOME": os.environ.get("PREFECT_HOME") or str(data / "prefect-home"),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOCAL_STORAGE_PATH": str(data / "prefect-results"),
        "BIN": str(Path(sys.executable).parent), "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def sh(args: list[str], env: dict[str, str],
       timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def searchrl_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return sh([sys.executable, "-m", "searchrl", *args], env)


@contextlib.contextmanager
def prefect_server(env: dict[str, str], timeout_s: float = 180) -> Iterator[None]:
    """A local Prefect server on env's PREFECT_API_URL for the block (one for all weeks);
    one already answering there is used as it is. Stopped (SIGTERM, then SIGKILL) after."""
    import httpx

    url = env["PREFECT_API_URL"]
    home = Path(env["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    proc = None
    if not healthy():
        port = url.rsplit(":", 1)[1].split("/")[0]
        with (home / "server.log").open("ab") as log:
            proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server",
                                     "start", "--host", "127.0.0.1", "--port", port],
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        (home / "server.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + timeout_s
        while not healthy():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the Prefect server did not start on {url}: "
                                   f"{(home / 'server.log').read_text()[-2000:]}")
            time.sleep(1)
    try:
        yield
    finally:
        if proc is not None:
            _stop_group(proc, 10)


def _stop_group(proc: subprocess.Popen[Any], grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- running a week


@dataclass
class Attempt:
    """One run of the flow: its exit code (0: a decision, GO or NO-GO), wall seconds, and
    whether it was killed on purpose; the output's last lines when it failed."""

    exit_code: int
    seconds: float
    killed: bool = False
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def run_flow(overrides: list[str], env: dict[str, str], timeout_s: float,
             kill_when: Callable[[], bool] | None = None, log: Path | None = None) -> Attempt:
    """`python flows/pipeline.py --config configs/tiny.yaml OVERRIDES` on the kept server.
    `kill_when`: polled while it runs; once true the flow gets SIGTERM (as a scheduler's
    timeout sends it) and the attempt records `killed`."""
    began = time.monotonic()
    out = log or Path(os.devnull)
    with out.open("ab") as sink:
        proc = subprocess.Popen([sys.executable, "flows/pipeline.py", "--config", CONFIG,
                                 *overrides], cwd=ROOT, env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
        killed = False
        try:
            while proc.poll() is None:
                if time.monotonic() - began > timeout_s:
                    break
                if kill_when is not None and not killed and kill_when():
                    os.killpg(proc.pid, signal.SIGTERM)
                    killed = True
                time.sleep(0.2)
        finally:  # also when this script is stopped: the flow does not outlive it
            _stop_group(proc, 30)  # what the flow left (a retrieval server, ranks) goes too
    message = ""
    if proc.returncode != 0 and log is not None:
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if line.strip()]
        message = "\n".join(lines[-3:])
    return Attempt(int(proc.returncode or 0), time.monotonic() - began, killed, message)


def run_deployment(data: Path, port: int, overrides: list[str], env: dict[str, str],
                   timeout_s: int) -> dict[str, Any]:
    """One run of the `searchrl-tiny-local` deployment through scripts/deploy_smoke.sh (its
    server kept for the next week: KEEP_SERVER=1); the flow run's id, state and times."""
    began = time.monotonic()
    done = sh(["bash", "scripts/deploy_smoke.sh", *overrides],
              env | {"RUNS": "1", "KEEP_SERVER": "1", "PORT": str(port),
                     "SEARCHRL_DATA_DIR": str(data), "TIMEOUT_S": str(timeout_s)},
              timeout=timeout_s + 600)
    wall = time.monotonic() - began
    runs = RUN_LINE.findall(done.stdout)
    if done.returncode != 0 or len(runs) != 1:
        raise RuntimeError(f"the deployment run failed:\n{done.stdout[-4000:]}\n"
                           f"{done.stderr[-4000:]}")
    (flow_run, state, start, end), = runs
    seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    return {"flow_run_id": flow_run, "state": state, "start": start, "end": end,
            "flow_run_seconds": seconds, "script_wall_seconds": wall}


def stop_kept_server(env: dict[str, str]) -> None:
    """Stop the server deploy_smoke.sh left running (KEEP_SERVER=1) for the later weeks."""
    pid_file = Path(env["PREFECT_HOME"]) / "server.pid"
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def training_started(work: Path) -> Callable[[], bool]:
    """True once a process holds the training lock of `work` (its file names the holder)."""
    lock = work / "train_policy" / "checkpoints.lock"
    return lambda: lock.is_file() and lock.stat().st_size > 0


# --- what a week left


def stage_refs(work: Path) -> dict[str, dict[str, Any]]:
    from searchrl.config import STAGE_NAMES
    from searchrl.stages import REF_FILE

    return {s: json.loads((work / s / REF_FILE).read_text()) for s in STAGE_NAMES
            if (work / s / REF_FILE).is_file()}


def stage_keys(config: Any) -> dict[str, dict[str, str]]:
    """Each stage's key parts outside its input references, as the flow's cache key takes
    them (tasks/_common.py): its config fingerprint, code fingerprint, external inputs."""
    from searchrl.codehash import code_fingerprint
    from searchrl.datasets.io import fingerprint
    from searchrl.datasets.sources import source_fingerprint
    from searchrl.stages import STAGES

    keys = {name: {"config": config.fingerprint_of(name), "code": code_fingerprint(s.run),
                   "external": s.external_inputs(config) if s.external_inputs else ""}
            for name, s in STAGES.items()}
    # Validation's external inputs, apart: the data files and the stewards' overrides.
    overrides = config.validate_.overrides_path
    keys["validate_gold_labels"] |= {
        "data files": source_fingerprint(config.data),
        "stewards' overrides": fingerprint(overrides) if overrides else ""}
    return keys


def why_reran(stage: str, keys: tuple[dict[str, Any], dict[str, Any]],
              refs: tuple[dict[str, Any], dict[str, Any]]) -> list[str]:
    """The key parts of `stage` that differ between two weeks (refs: each week's ref.json)."""
    from searchrl.stages import STAGES

    (k1, k2), (r1, r2) = keys, refs
    labels = {"config": "its config values changed", "code": "its code changed",
              "external": "its inputs outside the references changed"
              + {"validate_gold_labels": " (data files, contracts, stewards' overrides)",
                 "evaluate_policy": " (the registered champion)",
                 "train_policy": " (the champion it starts from)"}.get(stage, "")}
    out = [labels[part] for part in labels if k1[stage][part] != k2[stage][part]]
    if stage == "validate_gold_labels" and labels["external"] in out:
        out.remove(labels["external"])
        out += [f"its {part} changed" for part in ("data files", "stewards' overrides")
                if k1[stage][part] != k2[stage][part]] or [labels["external"]]
    for upstream in STAGES[stage].upstream():
        a, b = r1.get(upstream, {}), r2.get(upstream, {})
        if (a.get("fingerprint"), a.get("files")) != (b.get("fingerprint"), b.get("files")):
            out.append(f"input {upstream} changed ({fingerprint_change(a, b)})")
    return out or ["no key part changed: its cached result was gone or stale"]


def fingerprint_change(a: dict[str, Any], b: dict[str, Any]) -> str:
    """What differs between two references' fingerprints: the named parts of a dataset's
    (`train=...|corpus=...`), else both fingerprints shortened."""
    fa, fb = str(a.get("fingerprint")), str(b.get("fingerprint"))
    if "|" in fa + fb:
        pa, pb = (dict(p.split("=", 1) for p in f.split("|") if "=" in p) for f in (fa, fb))
        parts = sorted(k for k in pa.keys() | pb.keys() if pa.get(k) != pb.get(k))
        return "changed parts: " + ", ".join(parts)
    if fa == fb:
        return "same fingerprint, other files"
    return f"fingerprint {fa[:12]}... -> {fb[:12]}..."


def registry(uri: str, name: str) -> dict[str, Any]:
    """Each alias's version, its decision and rollback tags (None: no such alias)."""
    from searchrl.tracking import CHALLENGER, PREVIOUS, model_version_tags, registered_policy

    out: dict[str, Any] = {"model": name}
    for alias in (CHALLENGER, "champion", PREVIOUS):
        found = registered_policy(uri, name, alias)
        if found is None:
            out[alias] = None
            continue
        tags = model_version_tags(uri, name, found["version"])
        out[alias] = {"version": found["version"], "decision": tags.get("decision"),
                      **{k: v for k, v in tags.items()
                         if k.startswith(("rolled_back", "restored"))}}
    return out


def champion_figures(uri: str, name: str) -> dict[str, Any]:
    """The champion's and the challenger's version, decision and test EM figure (the gate's
    figures are tagged on each version), for the champion line."""
    from searchrl.tracking import CHALLENGER, model_version_tags, registered_policy

    out: dict[str, Any] = {}
    for alias in ("champion", CHALLENGER):
        found = registered_policy(uri, name, alias)
        tags = model_version_tags(uri, name, found["version"]) if found else {}
        em = next((float(v) for k, v in sorted(tags.items())
                   if k in ("figure.em", "figure.trained_em", "figure.candidate_em")), None)
        out[alias] = None if found is None else {
            "version": found["version"], "decision": tags.get("decision"), "em": em}
    return out


def reached_the_model(work: Path, steward: dict[str, Any], sft_before: str | None,
                      stages_ran: set[str]) -> dict[str, Any]:
    """Whether the steward's correction is in the validated train split and the curriculum,
    and whether the cold start and training were rebuilt."""
    validated = json.loads((work / "validate_gold_labels" / "ref.json").read_text())
    rows = {r["id"]: r for r in read_rows(Path(validated["paths"]["train"]))}
    row = rows.get(steward["corrected_id"])
    sft = work / "train_policy" / "sft" / "searchrl_sft.json"
    # The curriculum: the questions GRPO trains on, or the row dropped with its reason.
    curriculum = json.loads((work / "filter_curriculum" / "ref.json").read_text())
    seen = [(status, r) for status, key in (("kept", "train_path"), ("dropped", "dropped_path"))
            if curriculum.get(key) for r in read_rows(Path(curriculum[key]))
            if r["id"] == steward["corrected_id"]]
    return {"corrected_id": steward["corrected_id"],
            "week2_curriculum": None if not seen else {
                "status": seen[0][0], "answers": seen[0][1]["golden_answers"],
                "reason": seen[0][1].get("reason", "")},
            "week2_train_answers": None if row is None else row["golden_answers"],
            "corrected_in_train_split": row is not None
            and row["golden_answers"] == steward["corrected_answers"],
            "cold_start_rebuilt": sft_before is not None and sft.is_file()
            and sft.read_text() != sft_before,
            "training_reran": "train_policy" in stages_ran,
            "superseded_checkpoints": sorted(
                p.name for p in (work / "train_policy").glob("checkpoints.superseded-*"))}


def drift_figures(work: Path) -> dict[str, Any]:
    audit = json.loads((work / "validate_gold_labels" / "audit.json").read_text())
    drift = audit.get("drift")
    if drift is None:
        return {"reference": None}
    return {"reference": drift["reference"], "warnings": drift["warnings"],
            "sets": {f"{s['kind']}:{s['name']}": {k: s[k] for k in
                                                   ("old", "new", "added", "removed", "changed")}
                     for s in drift["sets"]}}


def prefect_records(flow_runs: dict[str, str], run_name: str, since: Any) -> dict[str, Any]:
    """The decision artifact and the searchrl.* events of each week's flow run, from the API
    (PREFECT_API_URL of this process)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    from tasks.events import artifact_key

    key = artifact_key(run_name)
    week_of = {fr: week for week, fr in flow_runs.items()}
    out: dict[str, Any] = {"artifact_key": key, "artifacts": {}, "events": {}}
    events: dict[str, list[str]] = {}
    with get_client(sync_client=True) as client:
        for a in client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]))):
            week = week_of.get(str(a.flow_run_id))
            if week:
                out["artifacts"][week] = {"id": str(a.id), "headline": str(a.data).splitlines()[0]}
        deadline = time.monotonic() + 60  # the server stores events in batches
        while True:
            page = client.read_events(EventFilter(
                event=EventNameFilter(prefix=["searchrl."]),
                occurred=EventOccurredFilter(since=since)), limit=50)  # the API's most
            found = list(page.events)
            while page.next_page is not None:
                page = client.read_events_page(str(page.next_page))
                found += page.events
            events = {}
            for e in found:
                runs = [r.id.removeprefix("prefect.flow-run.") for r in e.related
                        if r.id.startswith("prefect.flow-run.")]
                week = next((week_of[r] for r in runs if r in week_of), "outside the runs")
                events.setdefault(week, []).append(f"{e.event} {e.resource.id}")
            done = all(any(".decision." in x for x in events.get(w, [])) for w in flow_runs)
            if done or time.monotonic() > deadline:
                break
            time.sleep(2)
    out["events"] = {w: sorted(v) for w, v in sorted(events.items())}
    return out


def parent_runs(uri: str, experiment: str, since_ms: int = 0) -> list[dict[str, Any]]:
    """Parent runs (oldest first) started at or after `since_ms`: id, status, and the stages
    that ran (its MLflow child runs)."""
    from mlflow import MlflowClient

    from searchrl.tracking import PARENT_TAG, child_runs

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    parents = [r for r in client.search_runs(
        [exp.experiment_id], filter_string=f"attributes.start_time >= {since_ms}",
        order_by=["attributes.start_time ASC"]) if PARENT_TAG not in r.data.tags]
    return [{"run_id": p.info.run_id, "status": p.info.status,
             "stages": [c["stage"] for c in child_runs(uri, p.info.run_id)]} for p in parents]


def rollback(overrides: list[str], env: dict[str, str], reason: str) -> dict[str, Any]:
    done = searchrl_cli(env, "rollback", "--reason", reason, *overrides)
    if done.returncode == 0:
        return {"done": True, "reason": reason, "result": json.loads(done.stdout)}
    return {"done": False, "exit_code": done.returncode,
            "message": (done.stderr.strip().splitlines() or [""])[-1]}


def quarantine_figures(work: Path, world: Path) -> dict[str, Any]:
    """Validation's rows per split: in, clean, quarantined; every row accounted for when
    the world's files hold `rows_in` rows, `rows_in == clean + quarantined` for each split
    and quarantine.jsonl holds every quarantined row. Empty when validation left no audit."""
    stage = work / "validate_gold_labels"
    if not (stage / "audit.json").is_file():
        return {}
    audit = json.loads((stage / "audit.json").read_text())
    splits = {name: {k: c.get(k, 0) for k in ("rows_in", "clean", "quarantined")}
              for name, c in audit.get("split_counts", {}).items()}
    held = (stage / "quarantine.jsonl")
    quarantine_rows = len(read_rows(held)) if held.is_file() else 0
    in_files = {s: _lines(world / f"{s}.jsonl") for s in ("train", "dev", "test")
                if (world / f"{s}.jsonl").is_file()}
    accounted = (all(c["rows_in"] == c["clean"] + c["quarantined"] for c in splits.values())
                 and quarantine_rows == sum(c["quarantined"] for c in splits.values())
                 and all(splits.get(s, {}).get("rows_in") == n for s, n in in_files.items()))
    return {"splits": splits, "quarantine_file_rows": quarantine_rows,
            "rows_in_world_files": in_files, "accounted": accounted}


def _lines(path: Path) -> int:
    """Rows of a JSONL file as lines (a malformed file's rows too)."""
    return sum(1 for line in path.read_text(errors="replace").splitlines() if line.strip())


def disk_figures(data: Path) -> dict[str, int]:
    """Bytes per part of a weekly deployment's state, and their total."""
    parts = {"work": data / "work", "mlflow_artifacts": data / "mlartifacts",
             "mlflow_db": data / "mlflow.db", "prefect_results": data / "prefect-results",
             "world": data / "world"}
    out = {name: disk_bytes(path) for name, path in parts.items()}
    out["embedding_cache"] = disk_bytes(data / "work" / "build_index" / "embedding_cache")
    out["total"] = sum(v for k, v in out.items() if k != "embedding_cache")
    return out
