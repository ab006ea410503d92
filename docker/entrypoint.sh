#!/bin/sh
# The image's entrypoint.
#   (no arguments)              -> the pipeline on $SEARCHRL_CONFIG (default: the real config)
#   --config F / key=value ...  -> the pipeline with these arguments
#   anything else (`prefect flow-run execute`, the command a Prefect Docker worker sets;
#   `bash`; `python -m searchrl ...`) -> run as given
# Before either: when the data volume ($SEARCHRL_DATA_DIR) is mounted and writable and has no
# stewards' overrides file yet, the image's copy is put there once. From then on stewards edit
# the volume's file (validate.overrides_path in prefect.yaml) and the next run reads it.
set -eu
APP_DIR=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)

data_dir=${SEARCHRL_DATA_DIR:-}
if [ -n "$data_dir" ] && [ -d "$data_dir" ] && [ -w "$data_dir" ]; then
  overrides="$data_dir/data_contracts/overrides.yaml"
  if [ ! -e "$overrides" ]; then
    mkdir -p "$data_dir/data_contracts"
    cp "$APP_DIR/data_contracts/overrides.yaml" "$overrides"
  fi
fi

if [ "$#" -eq 0 ]; then
  set -- --config "${SEARCHRL_CONFIG:-configs/qwen2.5-3b-8gpu.yaml}"
fi
case "$1" in
  -*|*=*) exec python "$APP_DIR/flows/pipeline.py" "$@" ;;
  *) exec "$@" ;;
esac
