"""The searchrl retraining pipeline. Start reading here.

Stages, in order (each a task in `tasks/`, each an MLflow child run of one parent run):

1. validate_gold_labels: data contracts, quarantine, audit report       (tasks/validate.py)
2. build_index: BM25 + faiss dense + hybrid indexes, poisoning scan, recall (tasks/index.py)
3. filter_curriculum: cold-start policy, difficulty, drop zero-variance   (tasks/curriculum.py)
4. train_policy: DeepSpeed GRPO with masked multi-turn search rollouts   (tasks/train.py)
5. evaluate_policy: EM/F1, searches, by hop count, baselines, label audit (tasks/evaluate.py)
6. decide_go_no_go: cost-payback model, gate, report; registers on GO    (tasks/gate.py)
Then retention (the config's `retention:`) prunes old runs, registry versions, superseded
checkpoints and embedding-cache shards, never what the champion or a rollback needs
(searchrl/retention.py).

Stages pass small frozen references (paths + fingerprints + run ids), never payloads.
Prefect also gets the decision as a keyed markdown artifact and events for automations (GO /
NO-GO, quarantine over threshold, gold-set drift, new gold-likely-wrong suspects, failed
stages): tasks/events.py; who hears of which: prefect-automations.yaml, installed by
flows/automations.py. Flow runs are named after `run.name`.
With `index.mode: service` the retrieval server runs around stages 3-5 (the ones that search):
started on `index.service_url` when the first of them asks for a searcher (never, when all
three come from cache), restarted once if it dies, stopped when they end or fail. The flow
owns it through the `SearcherProvider` it hands those stages (searchrl/retrieval/provider.py).
Run it: `python flows/pipeline.py --config configs/tiny.yaml [key.sub=value ...]`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

# Prefect waits 20 s for its temporary server by default; on a loaded 2-core machine (a test
# run beside a build) it took longer, and the run died with a traceback before any stage.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
if __name__ == "__main__":  # the imports below take ~20 s on 2 cores: say so before them
    print("searchrl: loading torch, transformers, DeepSpeed, Prefect and MLflow ...",
          file=sys.stderr, flush=True)

from prefect import flow
from prefect.exceptions import TerminationSignal
from prefect.settings import get_current_settings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # so `tasks` imports when run as a plain script or a deployment
    sys.path.insert(0, str(ROOT))

from searchrl.config import load_config  # noqa: E402
from searchrl.exit_codes import exit_code_table, exit_on_sigterm, report_error  # noqa: E402
from searchrl.retention import prune_after_run  # noqa: E402
from searchrl.retrieval.provider import retrieval_service  # noqa: E402
from searchrl.retrieval.service import check_service_token  # noqa: E402
from searchrl.tracking import (  # noqa: E402
    check_tracking_store,
    end_run,
    resolve_tracking_uri,
    start_parent_run,
)
from tasks.curriculum import filter_curriculum  # noqa: E402
from tasks.evaluate import evaluate_policy  # noqa: E402
from tasks.events import announce_new_suspects, publish_decision  # noqa: E402
from tasks.gate import decide_go_no_go  # noqa: E402
from tasks.index import build_index  # noqa: E402
from tasks.train import train_policy  # noqa: E402
from tasks.validate import validate_gold_labels  # noqa: E402


def _run_name() -> str:
    """The flow run's name: the config's `run.name`, which notifications and the UI show
    (prefect-automations.yaml). A config that does not load fails the run right after."""
    from prefect.runtime import flow_run

    params = flow_run.parameters
    config_path = str(params.get("config_path") or "configs/tiny.yaml")
    try:
        return load_config(config_path, list(params.get("overrides") or [])).run.name
    except Exception:
        return Path(config_path).stem


@flow(name="searchrl-pipeline", flow_run_name=_run_name, log_prints=True)
def pipeline(config_path: str = "configs/tiny.yaml",
             overrides: list[str] | None = None) -> dict[str, Any]:
    config = load_config(config_path, overrides or [])
    uri = resolve_tracking_uri(config.tracking.tracking_uri)
    check_tracking_store(uri, config.tracking.connect_timeout_s)
    check_service_token(config.index)  # an external retriever's wrong token fails here
    parent = start_parent_run(uri, config.tracking.experiment, config.run.name,
                              config.to_dict(), tags={"searchrl.config_path": config_path})
    try:
        dataset = validate_gold_labels(config, uri, parent.run_id)
        index = build_index(config, dataset, uri, parent.run_id)
        # One provider for the stages that search (a task parameter outside the cache key).
        with retrieval_service(config, index.index_dir) as searchers:
            curriculum = filter_curriculum(config, dataset, index, uri, parent.run_id,
                                           searchers=searchers)
            checkpoint = train_policy(config, dataset, index, curriculum, uri, parent.run_id,
                                      searchers=searchers)
            evaluation = evaluate_policy(config, dataset, index, checkpoint, uri,
                                         parent.run_id, searchers=searchers)
        announce_new_suspects(config, evaluation)
        decision = decide_go_no_go(config, dataset, curriculum, checkpoint, evaluation, uri,
                                   parent.run_id)
        publish_decision(config, decision)  # keyed artifact + go / no-go event
    except BaseException:
        end_run(uri, parent.run_id, "FAILED")
        raise
    end_run(uri, parent.run_id, "FINISHED")
    # retention: keeps what a rollback or the next run needs
    prune_after_run(config, uri, Path(get_current_settings().results.local_storage_path))
    print(f"decision: {decision.label}" + "".join(f"\n  - {r}" for r in decision.reasons))
    return {"parent_run_id": parent.run_id, "tracking_uri": uri, "dataset": dataset,
            "index": index, "curriculum": curriculum, "checkpoint": checkpoint,
            "evaluation": evaluation, "decision": decision}


def main(argv: list[str] | None = None) -> int:
    """Run the flow; 0 when it finished (GO or NO-GO: the decision is its result, not a
    failure), else the failed stage's error code (`searchrl.exit_codes`), message alone."""
    parser = argparse.ArgumentParser(description="Run the searchrl pipeline",
                                     epilog=exit_code_table(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = parser.parse_args(argv)
    # SIGTERM (a scheduler's timeout, `kill`): Prefect marks the run Crashed, then re-sends the
    # signal to the previous handler. Python's default would end the process without its exit
    # handlers, leaving Prefect's temporary server (stopped atexit) running; this one exits.
    exit_on_sigterm()
    try:
        load_config(args.config, args.overrides)  # a bad config fails before Prefect starts
        result = pipeline(config_path=args.config, overrides=args.overrides)
    except Exception as exc:  # Prefect has logged the failed run; the message is the fix
        signum = termination_signal_in(exc)
        if signum is not None:
            print(f"stopped by signal {signum} while Prefect was starting a stage (the flow run "
                  "is Failed, not Crashed); a re-run resumes from the completed stages",
                  file=sys.stderr)
            return 128 + signum
        return report_error(exc)
    decision = result["decision"]
    print(f"pipeline finished: {decision.label}; report {decision.report_html}\n"
          f"MLflow parent run {result['parent_run_id']} in {result['tracking_uri']}")
    return 0


def termination_signal_in(exc: BaseException) -> int | None:
    """The signal of a `TerminationSignal` in `exc`'s chain, else None. A SIGTERM that arrives
    while Prefect creates a task run is raised by Prefect's handler inside that creation, and
    Prefect's task engine then fails with another error ("Task run is not set") caused by it:
    the run ends Failed and the signal never reaches `exit_on_sigterm`'s handler."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, TerminationSignal):
            return int(current.signal)
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


if __name__ == "__main__":
    raise SystemExit(main())
