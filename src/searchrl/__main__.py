"""Command line: every stage runs without Prefect.

    python -m searchrl config --config configs/tiny.yaml [key=value ...]   # print resolved config
    python -m searchrl generate-world --config ... --out DIR
    python -m searchrl validate --config ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from searchrl.config import ConfigError, load_config
from searchrl.paths import StagePaths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="searchrl")
    parser.add_argument("stage", choices=["config", "generate-world", "validate"])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = parser.parse_intermixed_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    paths = StagePaths(config.run.work_dir)
    if args.stage == "config":
        print(json.dumps(config.to_dict(), indent=2))
    elif args.stage == "generate-world":
        from searchrl.data.synthetic import generate_world, write_world

        out = write_world(generate_world(config.data.synthetic), args.out or paths.source_dir)
        print(json.dumps({k: str(v) for k, v in out.items()}, indent=2))
    elif args.stage == "validate":
        from searchrl.contracts.validate import validate_gold_labels

        result = validate_gold_labels(config, args.out or paths.validate_dir)
        print(json.dumps(result.counts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
