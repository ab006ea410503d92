#!/usr/bin/env bash
# Deploy the pipeline from prefect.yaml to a real local Prefect server and run it through a
# process worker: `prefect server start` on 127.0.0.1 -> work pool -> `prefect deploy` ->
# `prefect deployment run` -> worker executes it -> assert the flow run COMPLETED.
# Usage: scripts/deploy_smoke.sh [key=value overrides passed to the flow ...]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
PORT=${PORT:-4299}
export PREFECT_HOME=${PREFECT_HOME:-$(mktemp -d)}
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export SEARCHRL_REPO_DIR=$PWD
LOG=$(mktemp -d)
cleanup() { kill "${SERVER_PID:-}" "${WORKER_PID:-}" 2>/dev/null || true; }
trap cleanup EXIT

"$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" >"$LOG/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 90); do
  curl -sf "$PREFECT_API_URL/health" >/dev/null 2>&1 && break
  sleep 1
done
curl -sf "$PREFECT_API_URL/health" >/dev/null || { cat "$LOG/server.log"; exit 1; }

"$BIN/prefect" work-pool create local-process --type process --overwrite >/dev/null
"$BIN/prefect" --no-prompt deploy --name searchrl-tiny-local >"$LOG/deploy.log" 2>&1 \
  || { cat "$LOG/deploy.log"; exit 1; }

PARAMS=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@")
RUN_OUT=$("$BIN/prefect" deployment run searchrl-pipeline/searchrl-tiny-local \
  --param "overrides=${PARAMS}")
RUN_ID=$(echo "$RUN_OUT" | grep -oE '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' | head -1)
echo "flow run $RUN_ID"

"$BIN/prefect" worker start --pool local-process --run-once >"$LOG/worker.log" 2>&1 &
WORKER_PID=$!
wait "$WORKER_PID" || true
STATE=$("$BIN/python" - "$RUN_ID" <<'PY'
import asyncio, sys
from prefect.client.orchestration import get_client
async def main() -> None:
    async with get_client() as client:
        run = await client.read_flow_run(sys.argv[1])
        print(run.state.type.value if run.state else "NONE")
asyncio.run(main())
PY
)
echo "state: $STATE"
[ "$STATE" = "COMPLETED" ] || { tail -50 "$LOG/worker.log"; exit 1; }
