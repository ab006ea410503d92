"""The searchrl retraining pipeline. Start reading here.

Stages, in order (each a task in `tasks/`, each an MLflow child run of one parent run):

1. validate_gold_labels: data contracts, quarantine, audit report        (tasks/validate.py)

Stages pass small frozen references (paths + fingerprints + run ids), never payloads.
Run it: `python flows/pipeline.py --config configs/tiny.yaml [key.sub=value ...]`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from prefect import flow

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # so `tasks` imports when run as a plain script or a deployment
    sys.path.insert(0, str(ROOT))

from searchrl.config import load_config  # noqa: E402
from searchrl.tracking import (  # noqa: E402
    check_tracking_store,
    end_run,
    resolve_tracking_uri,
    start_parent_run,
)
from tasks.validate import validate_gold_labels  # noqa: E402


@flow(name="searchrl-pipeline", log_prints=True)
def pipeline(config_path: str = "configs/tiny.yaml",
             overrides: list[str] | None = None) -> dict[str, Any]:
    config = load_config(config_path, overrides or [])
    uri = resolve_tracking_uri(config.tracking.tracking_uri)
    check_tracking_store(uri, config.tracking.connect_timeout_s)
    parent = start_parent_run(uri, config.tracking.experiment, config.run.name,
                              config.to_dict(), tags={"searchrl.config_path": config_path})
    try:
        dataset = validate_gold_labels(config, uri, parent.run_id)
    except BaseException:
        end_run(uri, parent.run_id, "FAILED")
        raise
    end_run(uri, parent.run_id, "FINISHED")
    return {"parent_run_id": parent.run_id, "tracking_uri": uri, "dataset": dataset}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the searchrl pipeline")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = parser.parse_args(argv)
    result = pipeline(config_path=args.config, overrides=args.overrides)
    print(f"pipeline finished: parent MLflow run {result['parent_run_id']} "
          f"in {result['tracking_uri']}")


if __name__ == "__main__":
    main()
