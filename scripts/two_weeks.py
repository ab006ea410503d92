#!/usr/bin/env python
"""Two weeks of the local deployment on CPU, end to end, and the figures that show it.

Week 1 runs prefect.yaml's `searchrl-tiny-local` deployment through a process worker on a real
local Prefect server (scripts/deploy_smoke.sh, KEEP_SERVER=1: one server for both weeks) on a
synthetic world written as files (`generate-world`; `data.source=files` through the run's
`overrides` parameter, so the deployment stays as users run it). A steward then corrects one
audit suspect and accepts another with `apply-audit`; new gold rows arrive (train rows held
back from week 1, answerable from the corpus) and some passages change. Week 2 runs the same
deployment. Then: which stages ran each week and why (the inputs of each re-run stage that
changed), the corrected label in week 2's train split, the drift report, the registry after
week 2, `rollback --reason` and the registry after it, the decision artifact and `searchrl.*`
events of both flow runs read back from the server, and week-2 / week-1 wall time.

Usage: .venv/bin/python scripts/two_weeks.py --data DIR [--json PATH] [--week2 key=value ...]
    [key=value ...]
DIR must be new or empty; key=value overrides go to every run (e.g. tests/flows FAST sizes),
`--week2` ones to week 2 and the rollback only (e.g. `train.init=champion`: week 2 continues
from week 1's champion, as a team switches once a champion exists).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from searchrl.text import normalize_answer

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tasks/ (the artifact key), as flows/pipeline.py does
    sys.path.insert(0, str(ROOT))
CONFIG = "configs/tiny.yaml"
DEPLOYMENT = "searchrl-pipeline/searchrl-tiny-local"
RUN_LINE = re.compile(r"^run (\S+) (\S+) start=(\S+) end=(\S+) waited_for_slot=[01]$", re.M)
HELD_BACK_FRACTION = 0.1  # of the world's train rows, arriving in week 2
CHANGED_PASSAGES = 3
REVISION = " This entry was revised after week 1."


def sh(args: list[str], env: dict[str, str],
       timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def searchrl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return sh([sys.executable, "-m", "searchrl", *args], env)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


# --- the world as files, and what changes between the weeks


def make_world(data: Path, overrides: list[str], env: dict[str, str]) -> dict[str, Any]:
    """generate-world into DIR/world; hold the last train rows back for week 2."""
    world = data / "world"
    done = searchrl(env, "generate-world", "--out", str(world), *overrides)
    if done.returncode != 0:
        raise SystemExit(f"generate-world failed:\n{done.stderr[-3000:]}")
    train = read_jsonl(world / "train.jsonl")
    k = max(2, int(len(train) * HELD_BACK_FRACTION))
    write_jsonl(world / "train.jsonl", train[:-k])
    write_jsonl(data / "held_back_train.jsonl", train[-k:])
    return {"dir": str(world), "train_rows_week1": len(train) - k, "held_back": k}


def data_step(data: Path) -> dict[str, Any]:
    """New gold rows (the held-back ones) appended; passages no question cites revised."""
    world = data / "world"
    arrived = read_jsonl(data / "held_back_train.jsonl")
    write_jsonl(world / "train.jsonl", read_jsonl(world / "train.jsonl") + arrived)
    cited = {d for split in ("train", "dev", "test")
             for r in read_jsonl(world / f"{split}.jsonl") for d in r.get("supporting_doc_ids", [])}
    corpus = read_jsonl(world / "corpus.jsonl")
    changed = [p for p in corpus if p["id"] not in cited][:CHANGED_PASSAGES]
    for p in changed:
        p["contents"] += REVISION
    write_jsonl(world / "corpus.jsonl", corpus)
    return {"rows_added": [r["id"] for r in arrived],
            "passages_changed": [p["id"] for p in changed]}


def world_overrides(data: Path) -> list[str]:
    world = data / "world"
    return ["data.source=files", *(f"data.{s}_path={world / f'{s}.jsonl'}"
                                   for s in ("train", "dev", "test", "corpus")),
            f"validate.overrides_path={data / 'overrides.yaml'}",
            f"tracking.tracking_uri=sqlite:///{data / 'mlflow.db'}"]


# --- one week: a run of the deployment


def run_week(data: Path, port: int, overrides: list[str], env: dict[str, str],
             timeout_s: int) -> dict[str, Any]:
    began = time.monotonic()
    done = sh(["bash", "scripts/deploy_smoke.sh", *overrides],
              env | {"RUNS": "1", "KEEP_SERVER": "1", "PORT": str(port),
                     "SEARCHRL_DATA_DIR": str(data), "TIMEOUT_S": str(timeout_s)},
              timeout=timeout_s + 600)
    wall = time.monotonic() - began
    runs = RUN_LINE.findall(done.stdout)
    if done.returncode != 0 or len(runs) != 1:
        raise SystemExit(f"the deployment run failed:\n{done.stdout[-4000:]}\n"
                         f"{done.stderr[-4000:]}")
    (flow_run, state, start, end), = runs
    from datetime import datetime

    seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    return {"flow_run_id": flow_run, "state": state, "start": start, "end": end,
            "flow_run_seconds": seconds, "script_wall_seconds": wall}


def stage_refs(work: Path) -> dict[str, dict[str, Any]]:
    from searchrl.config import STAGE_NAMES
    from searchrl.stages import REF_FILE

    return {s: json.loads((work / s / REF_FILE).read_text()) for s in STAGE_NAMES
            if (work / s / REF_FILE).is_file()}


def stage_keys(config: Any) -> dict[str, dict[str, str]]:
    """Each stage's key parts outside its input references, as the flow's cache key takes
    them (tasks/_common.py): its config fingerprint, code fingerprint, external inputs."""
    from searchrl.codehash import code_fingerprint
    from searchrl.data.io import fingerprint
    from searchrl.data.sources import source_fingerprint
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
    """The key parts of `stage` that differ between the weeks (refs: each week's ref.json)."""
    (k1, k2), (r1, r2) = keys, refs
    labels = {"config": "its config values changed", "code": "its code changed",
              "external": "its inputs outside the references changed"
              + {"validate_gold_labels": " (data files, contracts, stewards' overrides)",
                 "evaluate_policy": " (the registered champion)",
                 "train_policy": " (the champion it starts from)",
                 "decide_go_no_go": " (the curriculum's recorded cost)"}.get(stage, "")}
    out = [labels[part] for part in labels if k1[stage][part] != k2[stage][part]]
    if stage == "validate_gold_labels" and labels["external"] in out:
        out.remove(labels["external"])
        out += [f"its {part} changed" for part in ("data files", "stewards' overrides")
                if k1[stage][part] != k2[stage][part]] or [labels["external"]]
    from searchrl.stages import STAGES

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


# --- the steward


def pick_decisions(work: Path, train_rows: list[dict[str, Any]],
                   corpus_text: str) -> tuple[list[dict[str, Any]], str]:
    """One `correct` (a train suspect) and one `accept` (another suspect) from week 1's audit
    queue; without train suspects a clean train row is corrected. Returns rows, a note.

    `corpus_text`: the normalised passages, one per line. The correction is a whole-token span
    of one, as validation's answerability check requires (a span no passage holds, such as a
    policy's near-copy of a name, would be quarantined as unanswerable)."""
    eval_dir = work / "evaluate_policy"
    train_sus = read_jsonl(eval_dir / "suspect_labels_train.jsonl") \
        if (eval_dir / "suspect_labels_train.jsonl").is_file() else []
    test_sus = read_jsonl(eval_dir / "suspect_labels.jsonl") \
        if (eval_dir / "suspect_labels.jsonl").is_file() else []
    by_id = {r["id"]: r for r in train_rows}
    rows: list[dict[str, Any]] = []
    note = ""
    target = next((s for s in train_sus if s["example_id"] in by_id), None)
    if target is None:
        note = ("week 1's audit queue held no train suspect: a clean train row is corrected "
                "instead (as tests/flows/test_steward_changes.py does)")
        first = train_rows[0]
        target = {"example_id": first["id"], "split": "train", "key": f"train/{first['id']}",
                  "golden_answers": first["golden_answers"], "answer": ""}
    gold = by_id[target["example_id"]]
    answer = str(target.get("answer") or "").strip()
    if (answer and answer not in gold["golden_answers"]
            and f" {normalize_answer(answer)} " in corpus_text):
        corrected, source = [answer], "the policy's answer (found in the corpus)"
    else:  # another row's answer of the same type: an entity the corpus holds
        other = next(r for r in train_rows if r.get("type") == gold.get("type")
                     and r["golden_answers"] != gold["golden_answers"])
        corrected, source = list(other["golden_answers"]), f"row {other['id']}'s answer"
    rows.append(target | {"decision": "correct", "corrected_answers": corrected,
                          "reason": f"two_weeks.py steward: gold replaced by {source}",
                          "steward": "two-weeks-steward"})
    accept = next((s for s in [*train_sus, *test_sus] if s["key"] != target["key"]), None)
    if accept is None:  # a clean row, accepted as it stands (an override no check needs)
        note += ("; " if note else "") + "no second suspect: a clean train row is accepted"
        clean = next(r for r in train_rows if r["id"] != target["example_id"])
        accept = {"example_id": clean["id"], "split": "train", "key": f"train/{clean['id']}",
                  "golden_answers": clean["golden_answers"], "answer": ""}
    rows.append(accept | {"decision": "accept", "reason": "two_weeks.py steward: gold "
                          "checked against its passages and kept",
                          "steward": "two-weeks-steward"})
    return rows, note


def steward_step(data: Path, work: Path, overrides: list[str],
                 env: dict[str, str]) -> dict[str, Any]:
    world = data / "world"
    corpus_text = "".join(f" {normalize_answer(p['contents'])} \n"
                          for p in read_jsonl(world / "corpus.jsonl"))
    validated = json.loads((work / "validate_gold_labels" / "ref.json").read_text())
    train_rows = read_jsonl(Path(validated["paths"]["train"]))
    rows, note = pick_decisions(work, train_rows, corpus_text)
    decisions = data / "steward_decisions.jsonl"
    write_jsonl(decisions, rows)
    done = searchrl(env, "apply-audit", "--decisions", str(decisions), *overrides)
    if done.returncode != 0:
        raise SystemExit(f"apply-audit failed:\n{done.stdout}\n{done.stderr[-3000:]}")
    return {"decisions": [{k: r.get(k) for k in ("key", "tier", "decision", "golden_answers",
                                                  "corrected_answers", "reason")} for r in rows],
            "apply_audit": json.loads(done.stdout), "note": note,
            "corrected_id": rows[0]["example_id"],
            "corrected_answers": rows[0]["corrected_answers"]}


# --- what week 2 shows


def registry(uri: str, name: str) -> dict[str, Any]:
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


def reached_the_model(work: Path, steward: dict[str, Any], sft_before: str | None,
                      week2_stages: set[str]) -> dict[str, Any]:
    validated = json.loads((work / "validate_gold_labels" / "ref.json").read_text())
    rows = {r["id"]: r for r in read_jsonl(Path(validated["paths"]["train"]))}
    row = rows.get(steward["corrected_id"])
    sft = work / "train_policy" / "sft" / "searchrl_sft.json"
    # The curriculum: the questions GRPO trains on, or the row dropped with its reason.
    curriculum = json.loads((work / "filter_curriculum" / "ref.json").read_text())
    seen = [(status, r) for status, key in (("kept", "train_path"), ("dropped", "dropped_path"))
            if curriculum.get(key) for r in read_jsonl(Path(curriculum[key]))
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
            "training_reran": "train_policy" in week2_stages,
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
    """The decision artifact and the searchrl.* events of each week's flow run, from the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    from tasks.events import artifact_key

    key = artifact_key(run_name)
    week_of = {fr: week for week, fr in flow_runs.items()}
    out: dict[str, Any] = {"artifact_key": key, "artifacts": {}, "events": {}}
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
            events: dict[str, list[str]] = {}
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


def week_stages(uri: str, experiment: str) -> list[set[str]]:
    """Per parent run (oldest first): the stages that ran, its MLflow child runs."""
    from mlflow import MlflowClient

    from searchrl.tracking import PARENT_TAG, child_runs

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r} in {uri}"
    parents = [r for r in client.search_runs([exp.experiment_id],
                                             order_by=["attributes.start_time ASC"])
               if PARENT_TAG not in r.data.tags]
    return [{c["stage"] for c in child_runs(uri, p.info.run_id)} for p in parents]


def rollback(overrides: list[str], env: dict[str, str]) -> dict[str, Any]:
    reason = "two_weeks.py: week 2's champion rolled back to show the way back"
    done = searchrl(env, "rollback", "--reason", reason, *overrides)
    if done.returncode == 0:
        return {"done": True, "reason": reason, "result": json.loads(done.stdout)}
    return {"done": False, "exit_code": done.returncode,
            "message": (done.stderr.strip().splitlines() or [""])[-1]}


# --- the two weeks


def two_weeks(data: Path, overrides: list[str], port: int, timeout_s: int,
              env: dict[str, str], week2_overrides: list[str] | None = None) -> dict[str, Any]:
    from datetime import UTC, datetime

    from searchrl.config import load_config
    from searchrl.stages import STAGES

    since = datetime.now(UTC)
    work = data / "work"
    world = make_world(data, overrides, env)
    (data / "overrides.yaml").write_text("[]\n")
    run_overrides = [*world_overrides(data), *overrides]
    week_overrides = (run_overrides, [*run_overrides, *(week2_overrides or [])])
    # As the deployment runs it: its own overrides (the work dir), then ours.
    configs = [load_config(CONFIG, [f"run.work_dir={work}", *o]) for o in week_overrides]
    config = configs[-1]
    uri = f"sqlite:///{data / 'mlflow.db'}"
    gate = STAGES["decide_go_no_go"]
    keys: list[dict[str, Any]] = []
    refs: list[dict[str, Any]] = []
    weeks: list[dict[str, Any]] = []
    steward: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    sft_before: str | None = None
    for week in (1, 2):
        if week == 2:
            steward = steward_step(data, work, run_overrides, env)
            changes = data_step(data)
        keys.append(stage_keys(configs[week - 1]))
        weeks.append(run_week(data, port, week_overrides[week - 1], env, timeout_s))
        assert gate.external_inputs is not None
        keys[-1]["decide_go_no_go"]["external"] = gate.external_inputs(configs[week - 1])
        refs.append(stage_refs(work))
        # Week 1's references are kept before week 2 replaces them.
        (data / f"week{week}_refs.json").write_text(json.dumps(refs[-1], indent=1))
        if week == 1:
            sft = work / "train_policy" / "sft" / "searchrl_sft.json"
            sft_before = sft.read_text() if sft.is_file() else None
    ran = week_stages(uri, config.tracking.experiment)
    assert len(ran) == 2, f"expected 2 parent runs in {uri}, found {len(ran)}"
    for record, stages in zip(weeks, ran, strict=True):
        record["stages_ran"] = sorted(stages, key=list(STAGES).index)
    weeks[0]["why"] = {s: ["no earlier result in the deployment's storage"]
                       for s in weeks[0]["stages_ran"]}
    weeks[1]["why"] = {s: why_reran(s, (keys[0], keys[1]), (refs[0], refs[1]))
                       for s in weeks[1]["stages_ran"]}
    for record, ref in zip(weeks, refs, strict=True):
        gate_ref = ref.get("decide_go_no_go", {})
        record["decision"] = {"go": gate_ref.get("go"), "reasons": gate_ref.get("reasons", [])}
    after_week2 = registry(uri, config.registry_model_name)
    back = rollback(week_overrides[1], env)
    return {
        "command": [sys.executable, "scripts/two_weeks.py", "--data", str(data),
                    *(f"--week2={o}" for o in week2_overrides or []), *overrides],
        "world": world, "steward": steward, "data_changes": changes, "weeks": weeks,
        "reached_the_model": reached_the_model(work, steward, sft_before, ran[1]),
        "drift": drift_figures(work), "registry_after_week2": after_week2,
        "rollback": back, "registry_after_rollback": registry(uri, config.registry_model_name),
        "prefect": prefect_records({"week1": weeks[0]["flow_run_id"],
                                    "week2": weeks[1]["flow_run_id"]}, config.run.name, since),
        "week2_over_week1": weeks[1]["flow_run_seconds"] / weeks[0]["flow_run_seconds"],
    }


def summary(fig: dict[str, Any]) -> str:
    lines = [f"world: {fig['world']['dir']} ({fig['world']['train_rows_week1']} train rows in "
             f"week 1, {fig['world']['held_back']} held back for week 2)"]
    for n, week in enumerate(fig["weeks"], start=1):
        d = week["decision"]
        lines += [f"\n== week {n}: flow run {week['flow_run_id']} {week['state']}, "
                  f"{week['flow_run_seconds']:.0f} s ({week['script_wall_seconds']:.0f} s with "
                  f"deploy and worker); decision {'GO' if d['go'] else 'NO-GO'}",
                  *(f"   {s}: {'; '.join(why)}" for s, why in week["why"].items())]
        if not week["why"]:
            lines.append("   no stage ran (every one came from the deployment's storage)")
        if n == 1:
            st = fig["steward"]
            lines += ["\n== steward (apply-audit)" + (f": {st['note']}" if st["note"] else ""),
                      *(f"   {d['decision']} {d['key']} ({d.get('tier') or 'clean row'}): gold "
                        f"{d['golden_answers']}"
                        + (f" -> {d['corrected_answers']}" if d["decision"] == "correct" else "")
                        for d in st["decisions"]),
                      f"   overrides added: {st['apply_audit']['added']}",
                      f"== new data: {len(fig['data_changes']['rows_added'])} train rows added, "
                      f"passages changed: {fig['data_changes']['passages_changed']}"]
    m = fig["reached_the_model"]
    lines += ["\n== the correction reached the model",
              f"   week 2 train split, {m['corrected_id']}: {m['week2_train_answers']} "
              f"(corrected: {m['corrected_in_train_split']}); in week 2's curriculum: "
              f"{m['week2_curriculum']}",
              f"   cold start rebuilt: {m['cold_start_rebuilt']}; training re-ran: "
              f"{m['training_reran']}; old checkpoints moved aside: {m['superseded_checkpoints']}"]
    dr = fig["drift"]
    lines += [f"\n== drift (week 2's audit) vs {dr['reference']}",
              *(f"   {name}: {v['old']} -> {v['new']} rows, +{v['added']} -{v['removed']} "
                f"~{v['changed']}" for name, v in dr.get("sets", {}).items()),
              *(f"   warning: {w}" for w in dr.get("warnings", []))]
    for label, key in (("registry after week 2", "registry_after_week2"),
                       ("registry after rollback", "registry_after_rollback")):
        reg = fig[key]
        lines.append(f"\n== {label} ({reg['model']}): " + ", ".join(
            f"{a}=v{v['version']} ({v['decision']})" if v else f"{a}=none"
            for a, v in reg.items() if a != "model"))
        if key == "registry_after_week2":
            lines += [f"   week 2 decision reason: {r}"
                      for r in fig["weeks"][1]["decision"]["reasons"]]
            rb = fig["rollback"]
            lines.append(f"== rollback: {rb['result'] if rb['done'] else rb['message']}")
    pf = fig["prefect"]
    lines += [f"\n== Prefect artifacts ({pf['artifact_key']})",
              *(f"   {w}: {a['headline']}" for w, a in pf["artifacts"].items()),
              "== Prefect events",
              *(f"   {w}: {e}" for w, evs in pf["events"].items() for e in evs),
              f"\nweek 2 / week 1 flow-run time: {fig['week2_over_week1']:.2f}"]
    return "\n".join(lines)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a new or empty directory")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--port", type=int, default=None, help="Prefect server port (free one)")
    parser.add_argument("--timeout-s", type=int, default=3600, help="per week")
    parser.add_argument("--week2", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for week 2 (and the rollback) only; repeatable")
    parser.add_argument("overrides", nargs="*", help="key.sub=value, for every run")
    args = parser.parse_args(argv)
    data: Path = args.data.resolve()
    if data.exists() and any(data.iterdir()):
        parser.error(f"--data {data} is not empty: give a new directory")
    data.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    port = args.port or free_port()
    home = Path(os.environ.get("PREFECT_HOME") or data / "prefect-home")
    os.environ |= {"PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
                   "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env = dict(os.environ) | {"BIN": str(Path(sys.executable).parent),
                              "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                              "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    try:
        figures = two_weeks(data, args.overrides, port, args.timeout_s, env, args.week2)
    finally:  # the server deploy_smoke.sh left running for week 2
        pid_file = home / "server.pid"
        if pid_file.is_file():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
    print(summary(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
