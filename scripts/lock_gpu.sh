#!/usr/bin/env bash
# Re-lock the GPU image's Python dependencies: docker/requirements-gpu.txt, every package pinned
# with its hashes, resolved from pyproject.toml (base + `gpu` extra) under
# docker/constraints-gpu.txt for the image's Python (3.11) and glibc (Ubuntu 22.04: 2.35).
# Reads only the package index's metadata (no wheels downloaded); about 10 s.
# Run it after changing pyproject.toml's dependencies; the Dockerfile installs the lock as is.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
"$UV" pip compile pyproject.toml --extra gpu --constraint docker/constraints-gpu.txt \
  --python-version 3.11 --python-platform x86_64-manylinux_2_35 --generate-hashes \
  --custom-compile-command scripts/lock_gpu.sh --quiet --output-file docker/requirements-gpu.txt
