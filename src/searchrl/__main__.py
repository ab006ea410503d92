"""Command line: every stage runs without Prefect, through the same stage functions the flow's
tasks call (`searchrl.stages`), reading its inputs from the upstream stages' `ref.json`
under `run.work_dir`.

    python -m searchrl config --config configs/tiny.yaml [key.sub=value ...]
    python -m searchrl prepare-data --spec data_spec.yaml --out data/prepared
                                    # real data (Search-R1 / FlashRAG layouts) -> data.yaml
    python -m searchrl generate-world --config ... [--out DIR]
    python -m searchrl validate   --config ...     # stage 1
    python -m searchrl index      --config ...     # stage 2
    python -m searchrl curriculum --config ...     # stage 3 (cold start + difficulty filter)
    python -m searchrl train      --config ...     # stage 4
    python -m searchrl train-rank --config ...     # one rank of stage 4: what the stage's
                                    # DeepSpeed launcher starts (train.launch.mode=deepspeed)
    python -m searchrl evaluate   --config ...     # stage 5
    python -m searchrl gate       --config ...     # stage 6 (exit 0 on GO, 1 on NO-GO);
                                    # gate.freeze_promotions=true: decide, never promote
    python -m searchrl rollback --reason TEXT [--to VERSION] --config ...
                                    # point the registry's champion back at its
                                    # previous-champion (or at VERSION: a retry changes
                                    # nothing), recording why; one the store interrupted
                                    # (exit 7) is finished by the next rollback
    python -m searchrl prune --config ... [--dry-run]
                                    # retention (the config's `retention:`): delete old
                                    # runs, versions, checkpoints, cache shards; --dry-run
                                    # prints what it would delete and the bytes
    python -m searchrl apply-audit --decisions FILE [--steward NAME] --config ...
                                    # a steward's decisions on the label-noise audit's
                                    # suspect_labels*.jsonl -> validate.overrides_path

`--mlflow-run-id ID` logs the stage into that existing MLflow run (store from
`tracking.tracking_uri` / `$MLFLOW_TRACKING_URI`); without it nothing is tracked.

An expected error (config, missing input, data, contract, quarantine threshold, service,
artifact, training) prints its message alone and exits with its own code
(`searchrl.exit_codes`, listed by `--help`); a traceback means a bug (exit 70).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig, load_config
from searchrl.exit_codes import exit_code_table, report_error
from searchrl.paths import StagePaths
from searchrl.sinks import MetricsSink, NullSink

# CLI name -> stage name (searchrl.stages.STAGES)
STAGE_COMMANDS = {"validate": "validate_gold_labels", "index": "build_index",
                  "curriculum": "filter_curriculum", "train": "train_policy",
                  "evaluate": "evaluate_policy", "gate": "decide_go_no_go"}
COMMANDS = ["config", "generate-world", "prepare-data", "apply-audit", *STAGE_COMMANDS,
            "train-rank", "rollback", "prune"]


def _sink(config: PipelineConfig, run_id: str | None) -> MetricsSink:
    if run_id is None:
        return NullSink()
    from searchrl.tracking import MlflowSink, resolve_tracking_uri

    return MlflowSink(resolve_tracking_uri(config.tracking.tracking_uri), run_id)


def _inputs(command: str, config: PipelineConfig) -> list[Any]:
    """The stage's input references, read from the stages that produce them."""
    from searchrl.stages import STAGES, read_ref

    producer = {STAGES[name].output_kind(): (cli, name) for cli, name in STAGE_COMMANDS.items()}
    paths = StagePaths(config.run.work_dir)
    inputs: list[Any] = []
    for kind, optional in STAGES[STAGE_COMMANDS[command]].input_kinds():
        cli, stage_name = producer[kind]
        stage_dir = paths.work_dir / stage_name
        if optional and not (stage_dir / "ref.json").is_file():
            inputs.append(None)
            continue
        _check_written_by_this_config(config, stage_name, stage_dir, cli)
        inputs.append(read_ref(kind, stage_dir, cli))
    return inputs


# Beside a stage's ref.json, when the CLI ran the stage: the config values the stage read, so
# a later command with another config does not build on it unawares. Tied to the ref.json it
# was written with (its sha256): a ref.json written since (by the flow) is not judged by it.
CLI_CONFIG_FILE = "cli_config.json"


def _ref_sha(stage_dir: Path) -> str | None:
    ref = stage_dir / "ref.json"
    return hashlib.sha256(ref.read_bytes()).hexdigest() if ref.is_file() else None


def _record_config(config: PipelineConfig, stage_name: str, stage_dir: Path) -> None:
    from searchrl.datasets.io import atomic_write_text

    atomic_write_text(stage_dir / CLI_CONFIG_FILE, json.dumps(
        {"ref_sha256": _ref_sha(stage_dir), "fingerprint": config.fingerprint_of(stage_name),
         "inputs": config.inputs_of(stage_name)}, indent=2, default=str))


def _check_written_by_this_config(config: PipelineConfig, stage_name: str, stage_dir: Path,
                                  cli: str) -> None:
    """StageInputError (exit 3) naming the settings that differ when the CLI wrote
    `stage_dir` with another config than this one."""
    from searchrl.stages import StageInputError
    from searchrl.tracking import _flatten  # dotted keys, as MLflow params show them

    try:
        recorded = json.loads((stage_dir / CLI_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # written by the flow (its cache keys tell configs apart), or unreadable
    if (not isinstance(recorded, dict) or recorded.get("ref_sha256") != _ref_sha(stage_dir)
            or recorded.get("fingerprint") == config.fingerprint_of(stage_name)):
        return
    there = _flatten(recorded.get("inputs") or {})
    here = _flatten(json.loads(json.dumps(config.inputs_of(stage_name), default=str)))
    differ = [f"{key} is {there.get(key)!r} there, {here.get(key)!r} here"
              for key in sorted(set(there) | set(here)) if there.get(key) != here.get(key)]
    shown = "; ".join(differ[:5]) + (f" (and {len(differ) - 5} more)" if len(differ) > 5 else "")
    raise StageInputError(
        f"{stage_dir} was written by another config ({shown or 'its settings differ'}): "
        f"re-run `python -m searchrl {cli}` with this config, or set run.work_dir to a "
        "directory of its own")


def _run(command: str, config: PipelineConfig, args: argparse.Namespace) -> int:
    if command == "config":
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    if command == "prepare-data":
        from searchrl.datasets.prepare import load_spec, prepare_data

        if args.spec is None or args.out is None:
            print("prepare-data needs --spec SPEC.yaml and --out DIR", file=sys.stderr)
            return 2
        prepared = prepare_data(load_spec(args.spec), args.out)
        print(json.dumps({"data_yaml": str(args.out / "data.yaml"),
                          "counts": prepared.counts}, indent=2, default=str))
        from searchrl.notify import gold_set_updated  # a Prefect trigger, when one listens

        gold_set_updated("prepare-data", data_yaml=args.out / "data.yaml")
        return 0
    if command == "apply-audit":
        return _apply_audit(config, args)
    if command == "train-rank":
        return _train_rank(config, args)
    if command == "rollback":
        return _rollback(config, args)
    if command == "prune":
        return _prune(config, args)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        print(f"--out {args.out}: exists and is not a directory; name a directory",
              file=sys.stderr)
        return 2
    if command == "generate-world":
        from searchrl.datasets.synthetic import generate_world
        from searchrl.datasets.world import write_world

        written = write_world(generate_world(config.data.synthetic),
                              args.out or StagePaths(config.run.work_dir).source_dir)
        print(json.dumps({k: str(v) for k, v in written.items()}, indent=2))
        return 0
    from searchrl.stages import STAGES

    inputs = _inputs(command, config)  # StageInputError: exit 3, naming what to run first
    stage_name = STAGE_COMMANDS[command]
    ref = STAGES[stage_name].run(config, *inputs, _sink(config, args.mlflow_run_id))
    _record_config(config, stage_name, StagePaths(config.run.work_dir).work_dir / stage_name)
    print(json.dumps(dataclasses.asdict(ref), indent=2))
    if command == "gate":
        return 0 if ref.go else 1
    return 0


def _train_rank(config: PipelineConfig, args: argparse.Namespace) -> int:
    """One rank of the train stage, as DeepSpeed's launcher starts it (`$RANK` etc. set):
    the stage's inputs from the upstream `ref.json`, then `train.stage.launched_rank`; rank
    0 logs into `--mlflow-run-id` and writes the stage's reference."""
    from searchrl.train.distributed.launcher import (
        env_rank,
        guard_rank_process,
        load_launch_secrets,
    )
    from searchrl.train.stage import launched_rank

    guard_rank_process()  # never outlive the stage that launched us
    # Errors (LaunchError, StageInputError, DataError, ...) exit with their codes in main().
    load_launch_secrets()  # several nodes: the retriever token etc.
    dataset, index, curriculum = _inputs("train", config)
    run_id = args.mlflow_run_id if env_rank() == 0 else None
    ref = launched_rank(config, dataset, index, curriculum, _sink(config, run_id))
    print(json.dumps(dataclasses.asdict(ref), indent=2))
    return 0


def _rollback(config: PipelineConfig, args: argparse.Namespace) -> int:
    """Restore the previous champion of `searchrl-<run.name>` (or eval.registry_model_name)
    in the configured tracking store; the reason is recorded on the registry."""
    from searchrl.tracking import check_tracking_store, resolve_tracking_uri, rollback

    if not args.reason:
        print("rollback needs --reason TEXT (recorded on the registry)", file=sys.stderr)
        return 2
    uri = resolve_tracking_uri(config.tracking.tracking_uri)
    check_tracking_store(uri, config.tracking.connect_timeout_s)
    done = rollback(uri, config.registry_model_name, args.reason,
                    alias=config.gate.registry_alias, to_version=args.to)
    print(json.dumps(done, indent=2))
    return 0


def _prune(config: PipelineConfig, args: argparse.Namespace) -> int:
    """Apply (or with --dry-run, list) retention on the work dir, the tracking store and
    Prefect's local result records; prints each deletion with its bytes, then the total."""
    from searchrl.retention import prefect_result_storage, prune
    from searchrl.tracking import check_tracking_store, resolve_tracking_uri

    uri = resolve_tracking_uri(config.tracking.tracking_uri)
    check_tracking_store(uri, config.tracking.connect_timeout_s)
    # Asking Prefect costs a process start; only when its records are pruned.
    storage = prefect_result_storage() if config.retention.prefect_expired_results else None
    plan = prune(config, uri, dry_run=args.dry_run, prefect_storage=storage)
    print(plan.summary(dry_run=args.dry_run))
    return 0


def _apply_audit(config: PipelineConfig, args: argparse.Namespace) -> int:
    """Merge decided audit rows into the overrides file; exit 1 when some conflict."""
    from searchrl.validation.overrides import merge_audit_decisions

    target = config.validate_.overrides_path
    if args.decisions is None or not args.decisions.is_file():
        print(f"apply-audit needs --decisions FILE (an edited suspect_labels*.jsonl from the "
              f"evaluate stage); got {args.decisions}", file=sys.stderr)
        return 2
    if target is None:
        print("validate.overrides_path is null: set it to the overrides file to write",
              file=sys.stderr)
        return 2
    merged = merge_audit_decisions(args.decisions, Path(target), steward=args.steward)
    print(json.dumps({"overrides": str(target), "added": [o.id for o in merged.added],
                      "unchanged": merged.unchanged, "conflicts": merged.conflicts,
                      "undecided": merged.undecided}, indent=2))
    if merged.added:
        from searchrl.notify import gold_set_updated  # a Prefect trigger, when one listens

        gold_set_updated("apply-audit", overrides=target, added=len(merged.added))
    return 1 if merged.conflicts else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="searchrl", epilog=exit_code_table(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", type=Path, default=None,
                        help="generate-world / prepare-data: where to write")
    parser.add_argument("--spec", type=Path, default=None, help="prepare-data: the spec YAML")
    parser.add_argument("--decisions", type=Path, default=None,
                        help="apply-audit: the audit's suspect rows with `decision` filled in")
    parser.add_argument("--steward", default=None,
                        help="apply-audit: who decided (for rows that leave `steward` empty)")
    parser.add_argument("--reason", default=None,
                        help="rollback: why the champion is rolled back (recorded)")
    parser.add_argument("--dry-run", action="store_true",
                        help="prune: print what would be deleted and the bytes, delete nothing")
    parser.add_argument("--to", default=None, metavar="VERSION",
                        help="rollback: the registry version to make champion (idempotent)")
    parser.add_argument("--mlflow-run-id", default=None,
                        help="log the stage into this existing MLflow run")
    parser.add_argument("--local_rank", type=int, default=0,
                        help="train-rank: set by the deepspeed launcher (the rank is read "
                        "from $RANK)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _run(args.command, load_config(args.config, args.overrides), args)
    except Exception as exc:  # an expected error's message alone; a bug's traceback
        return report_error(exc)


if __name__ == "__main__":
    raise SystemExit(main())
