#!/usr/bin/env bash
# Re-lock the environments CI builds, so that an upstream release never changes what CI installs
# (sentry-sdk 3.0.0, released 2026-12-05, broke label-studio 1.23.2's import overnight):
#   requirements/lock.txt          .venv: pyproject.toml with every extra but gpu (cpu, dev, ray),
#                                  torch pinned to the CPU build on local disk;
#   requirements/steward-lock.txt  .venv-steward: label-studio and everything it pulls in.
# Each is resolved as the package index stood at LOCK_DATE (uv's --exclude-newer), so a re-lock
# reproduces the same file until the date is moved on purpose. The Makefile installs them as
# constraints (`-c`): exactly these versions, whatever EXTRAS selects. The GPU image has its own
# lock (scripts/lock_gpu.sh). Reads only the index's metadata; a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
LOCK_DATE=${LOCK_DATE:-2026-12-05T00:00:00Z}
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
common=(--python-version 3.11 --exclude-newer "$LOCK_DATE" --custom-compile-command scripts/lock.sh
        --quiet)
"$UV" pip compile pyproject.toml --extra cpu --extra dev --extra ray \
  --constraint requirements/torch-cpu.txt --find-links "$TORCH_WHEELS" --no-emit-find-links \
  "${common[@]}" --output-file requirements/lock.txt
"$UV" pip compile requirements/steward.in "${common[@]}" --output-file requirements/steward-lock.txt
