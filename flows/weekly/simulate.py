"""N weeks of the weekly loop, simulated end to end, and the figures of each week.

`simulate` runs week after week through the real flow (`week.run_flow`, one Prefect server
for all weeks) on a synthetic world written as files. Before each week after the first: the
steward decides two rows of the last audit queue (`apply-audit`), held-back gold rows arrive,
and about `corpus_change` of the corpus is edited, added and removed. Faults, on the weeks
given: `retriever_down` (searches go to a retrieval service that is not there),
`malformed_gold` (the train file arrives cut in half; restored the week after),
`killed_mid_training` (SIGTERM once training holds its lock, then the same week again) and
`no_change` (nothing changes: every stage comes from the cache). Each week's record: its
attempts (exit code, seconds), the stages that ran, the decision, the champion and the
challenger, validation's quarantine counts, and the disk used after retention.

`two_weeks` is the two-week run of docs/results/two_weeks.md (`--weeks 2`), kept: the
deployment run twice around one steward step and one data change, with why each stage
re-ran, the rollback and the Prefect records.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flows.weekly import week as wk
from searchrl.simulation import world as wd

FAULTS = ("retriever_down", "malformed_gold", "killed_mid_training", "no_change")
# Failures a fault week must end in: exit codes of flows/pipeline.py (searchrl.exit_codes).
FLOW_RUN_ID = re.compile(r"/runs/flow-run/([0-9a-f-]{36})")


# Week (of every 8) -> its fault: each fault early, each followed by an ordinary week.
FAULT_CYCLE = {2: "no_change", 3: "retriever_down", 5: "malformed_gold",
               7: "killed_mid_training"}


def default_faults(weeks: int) -> dict[int, str]:
    """FAULT_CYCLE repeated every 8 weeks (week 1 is the plain first run)."""
    return {w: FAULT_CYCLE[(w - 1) % 8 + 1] for w in range(2, weeks + 1)
            if (w - 1) % 8 + 1 in FAULT_CYCLE}


@dataclass
class Plan:
    weeks: int
    overrides: list[str]  # for every run (e.g. tests/flows FAST sizes)
    faults: dict[int, str] = field(default_factory=dict)
    rows_per_week: int = 2  # held-back gold rows arriving each week
    corpus_change: float = 0.01  # of the corpus edited + added + removed each week
    rollback_weeks: tuple[int, ...] = ()  # weeks after which a rollback is asked for
    timeout_s: float = 3600


def _retriever_down() -> list[str]:
    from searchrl.train.distributed.deepspeed_setup import free_port

    port = free_port()  # nothing listens there: the service the stages search is down
    return ["index.mode=service", "index.service_managed=false",
            f"index.service_url=http://127.0.0.1:{port}"]


def _steward(data: Path, work: Path, overrides: list[str], env: dict[str, str]
             ) -> dict[str, Any] | None:
    """The steward's decisions on the last audit queue, through apply-audit: on the last
    validated train split, or the world's train file after a week whose validation failed
    (a failed stage leaves no ref.json)."""
    ref = work / "validate_gold_labels" / "ref.json"
    train_file = (Path(json.loads(ref.read_text())["paths"]["train"]) if ref.is_file()
                  else wd.world_dir(data) / "train.jsonl")
    if not train_file.is_file():
        return None
    train_rows = wd.read_rows(train_file)
    rows, note = wd.pick_decisions(work / "evaluate_policy", train_rows, wd.corpus_text(data),
                                   wd.decided_keys(data / "overrides.yaml"))
    decisions = data / "steward_decisions.jsonl"
    decisions.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    done = wk.searchrl_cli(env, "apply-audit", "--decisions", str(decisions), *overrides)
    if done.returncode != 0:
        raise RuntimeError(f"apply-audit failed:\n{done.stdout}\n{done.stderr[-3000:]}")
    return {"decisions": [{k: r.get(k) for k in ("key", "tier", "decision", "golden_answers",
                                                  "corrected_answers", "reason")} for r in rows],
            "apply_audit": json.loads(done.stdout), "note": note,
            "corrected_id": rows[0]["example_id"],
            "corrected_answers": rows[0]["corrected_answers"]}


def _change_world(data: Path, week: int, plan: Plan) -> wd.DataChange:
    corpus_rows = len(wd.read_rows(wd.world_dir(data) / "corpus.jsonl"))
    each = max(1, round(corpus_rows * plan.corpus_change / 3))
    change = wd.change_corpus(data, week, edited=each, added=each, removed=each)
    change.rows_added = wd.release_rows(data, plan.rows_per_week)
    return change


def run_one_week(data: Path, week: int, plan: Plan, env: dict[str, str],
                 base: list[str]) -> dict[str, Any]:
    """Change the world as week `week` does, run it (twice when killed), and record it."""
    work = data / "work"
    fault = plan.faults.get(week)
    record: dict[str, Any] = {"week": week, "fault": fault}
    if week > 1 and fault != "no_change":
        record["restored_gold_file"] = wd.restore_gold_file(data)
        record["steward"] = _steward(data, work, base, env)
        record["data_change"] = _change_world(data, week, plan).to_dict()
    if fault == "malformed_gold":
        record["corrupted"] = wd.corrupt_gold_file(data)
    overrides = [*base, *(_retriever_down() if fault == "retriever_down" else [])]
    since_ms = int(time.time() * 1000)
    log = data / "logs" / f"week{week:03d}.log"
    log.parent.mkdir(exist_ok=True)
    attempts = []
    if fault == "killed_mid_training":
        attempts.append(wk.run_flow(overrides, env, plan.timeout_s,
                                    kill_when=wk.training_started(work), log=log))
    attempts.append(wk.run_flow(overrides, env, plan.timeout_s, log=log))
    record["attempts"] = [a.to_dict() for a in attempts]
    record["seconds"] = sum(a.seconds for a in attempts)
    record["flow_runs"] = FLOW_RUN_ID.findall(log.read_text(errors="replace"))
    last = attempts[-1]
    record["completed"] = last.exit_code == 0
    uri = f"sqlite:///{data / 'mlflow.db'}"
    runs = wk.parent_runs(uri, _experiment(base), since_ms)
    record["runs"] = [{"status": r["status"], "stages": r["stages"]} for r in runs]
    gate = work / "decide_go_no_go" / "ref.json"
    if record["completed"] and gate.is_file():
        ref = json.loads(gate.read_text())
        record["decision"] = {"go": ref.get("go"), "reasons": ref.get("reasons", [])}
    record["registry"] = wk.champion_figures(uri, _model_name(base))
    record["quarantine"] = wk.quarantine_figures(work, wd.world_dir(data))
    record["disk"] = wk.disk_figures(data)
    if week in plan.rollback_weeks:
        record["rollback"] = wk.rollback(base, env, f"weeks.py: rollback asked after week "
                                                     f"{week}")
    return record


def _config(base: list[str]) -> Any:
    from searchrl.config import load_config

    return load_config(wk.CONFIG, base)


def _experiment(base: list[str]) -> str:
    return str(_config(base).tracking.experiment)


def _model_name(base: list[str]) -> str:
    return str(_config(base).registry_model_name)


def make_world(data: Path, overrides: list[str], env: dict[str, str],
               held_back: int | None) -> dict[str, Any]:
    """generate-world into DIR/world; hold back `held_back` train rows (None: 10%)."""
    done = wk.searchrl_cli(env, "generate-world", "--out", str(wd.world_dir(data)), *overrides)
    if done.returncode != 0:
        raise RuntimeError(f"generate-world failed:\n{done.stderr[-3000:]}")
    rows = len(wd.read_rows(wd.world_dir(data) / "train.jsonl"))
    return wd.hold_back(data, max(2, int(rows * 0.1)) if held_back is None else held_back)


def simulate(data: Path, plan: Plan, port: int,
             progress: Any = None) -> dict[str, Any]:
    """Run `plan.weeks` weeks (module docstring); `progress(record)` after each one."""
    env = wk.weekly_env(data, port)
    world = make_world(data, plan.overrides, env,
                       held_back=plan.rows_per_week * max(0, plan.weeks - 1))
    base = [*wd.world_overrides(data), f"run.work_dir={data / 'work'}", *plan.overrides]
    since = datetime.now(UTC)
    weeks = []
    with wk.prefect_server(env):
        for week in range(1, plan.weeks + 1):
            weeks.append(run_one_week(data, week, plan, env, base))
            (data / "weeks.json").write_text(json.dumps(
                {"world": world, "plan": _plan_dict(plan), "weeks": weeks}, indent=1,
                default=str))
            if progress is not None:
                progress(weeks[-1])
        flow_runs = {f"week{w['week']}/{n}": fr for w in weeks
                     for n, fr in enumerate(w["flow_runs"])}
        try:
            prefect = _prefect_outcomes(flow_runs, _config(base).run.name, since, env)
        except Exception as exc:  # the figures above stand without the server's records
            prefect = {"error": str(exc)}
    return {"world": world, "plan": _plan_dict(plan), "weeks": weeks, "prefect": prefect}


def _plan_dict(plan: Plan) -> dict[str, Any]:
    return {k: v for k, v in vars(plan).items()}


def _prefect_outcomes(flow_runs: dict[str, str], run_name: str, since: Any,
                      env: dict[str, str]) -> dict[str, Any]:
    """Each flow run's final state and its searchrl.* events, read from the server."""
    import os

    from prefect.client.orchestration import get_client

    os.environ["PREFECT_API_URL"] = env["PREFECT_API_URL"]
    states = {}
    with get_client(sync_client=True) as client:
        for key, flow_run in flow_runs.items():
            run = client.read_flow_run(flow_run)  # type: ignore[arg-type]
            states[key] = run.state.type.value if run.state else None
    records = wk.prefect_records(flow_runs, run_name, since)
    return {"states": states, "events": records["events"]}


# --- the two-week run (scripts/weeks.py --weeks 2; formerly scripts/two_weeks.py)


def two_weeks(data: Path, overrides: list[str], port: int, timeout_s: int,
              week2_overrides: list[str] | None = None) -> dict[str, Any]:
    """The deployment run twice: week 1; the steward's step and new data; week 2; then a
    rollback. Figures as scripts/two_weeks.py printed them, now `--weeks 2`
    (docs/results/two_weeks.md)."""
    from searchrl.stages import STAGES

    env = wk.weekly_env(data, port)
    since = datetime.now(UTC)
    work = data / "work"
    world = make_world(data, overrides, env, held_back=None)
    run_overrides = [*wd.world_overrides(data), *overrides]
    week_overrides = (run_overrides, [*run_overrides, *(week2_overrides or [])])
    # As the deployment runs it: its own overrides (the work dir), then ours.
    configs = [_config([f"run.work_dir={work}", *o]) for o in week_overrides]
    config = configs[-1]
    uri = f"sqlite:///{data / 'mlflow.db'}"
    keys: list[dict[str, Any]] = []
    refs: list[dict[str, Any]] = []
    weeks: list[dict[str, Any]] = []
    steward: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    sft_before: str | None = None
    try:
        for week in (1, 2):
            if week == 2:
                steward = _steward(data, work, run_overrides, env) or {}
                change = wd.two_weeks_change(data)
                changes = {"rows_added": change.rows_added,
                           "passages_changed": change.passages_edited}
            keys.append(wk.stage_keys(configs[week - 1]))
            weeks.append(wk.run_deployment(data, port, week_overrides[week - 1], env,
                                           timeout_s))
            refs.append(wk.stage_refs(work))
            # Week 1's references are kept before week 2 replaces them.
            (data / f"week{week}_refs.json").write_text(json.dumps(refs[-1], indent=1))
            if week == 1:
                sft = work / "train_policy" / "sft" / "searchrl_sft.json"
                sft_before = sft.read_text() if sft.is_file() else None
        ran = [set(r["stages"]) for r in wk.parent_runs(uri, config.tracking.experiment)]
        assert len(ran) == 2, f"expected 2 parent runs in {uri}, found {len(ran)}"
        for record, stages in zip(weeks, ran, strict=True):
            record["stages_ran"] = sorted(stages, key=list(STAGES).index)
        weeks[0]["why"] = {s: ["no earlier result in the deployment's storage"]
                           for s in weeks[0]["stages_ran"]}
        weeks[1]["why"] = {s: wk.why_reran(s, (keys[0], keys[1]), (refs[0], refs[1]))
                           for s in weeks[1]["stages_ran"]}
        for record, ref in zip(weeks, refs, strict=True):
            gate_ref = ref.get("decide_go_no_go", {})
            record["decision"] = {"go": gate_ref.get("go"),
                                  "reasons": gate_ref.get("reasons", [])}
        after_week2 = wk.registry(uri, config.registry_model_name)
        back = wk.rollback(week_overrides[1], env,
                           "weeks.py --weeks 2: week 2's champion rolled back to show the way back")
        import os

        os.environ["PREFECT_API_URL"] = env["PREFECT_API_URL"]
        return {
            "command": [sys.executable, "scripts/weeks.py", "--weeks", "2", "--data",
                        str(data), *(f"--week2={o}" for o in week2_overrides or []),
                        *overrides],
            "world": world, "steward": steward, "data_changes": changes, "weeks": weeks,
            "reached_the_model": wk.reached_the_model(work, steward, sft_before, ran[1]),
            "drift": wk.drift_figures(work), "registry_after_week2": after_week2,
            "rollback": back,
            "registry_after_rollback": wk.registry(uri, config.registry_model_name),
            "prefect": wk.prefect_records({"week1": weeks[0]["flow_run_id"],
                                           "week2": weeks[1]["flow_run_id"]},
                                          config.run.name, since),
            "week2_over_week1": weeks[1]["flow_run_seconds"] / weeks[0]["flow_run_seconds"],
        }
    finally:
        wk.stop_kept_server(env)
