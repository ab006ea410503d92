#!/usr/bin/env bash
# Deploy the pipeline from prefect.yaml to a real local Prefect server and run it through a
# process worker: `prefect server start` on 127.0.0.1 -> work pool -> `prefect deploy` ->
# RUNS x `prefect deployment run` (all at once) -> one worker executes them -> every flow run
# must end COMPLETED. The deployment allows one run at a time, so with RUNS=2 the second waits
# for the first (ENQUEUE) and then finds the first's stages in the deployment's storage.
# Usage: [RUNS=N] [SEARCHRL_DATA_DIR=dir] [KEEP_SERVER=1] scripts/deploy_smoke.sh [key=value ...]
#   key=value overrides are appended to the deployment's own `overrides` parameter.
#   A server already answering on PORT is used, not replaced; KEEP_SERVER=1 leaves the one
#   this call starts running (its pid in $PREFECT_HOME/server.pid) for a later call, e.g.
#   the next week of scripts/weeks.py --weeks 2, which stops it.
# Prints one line per flow run: `run <id> <state> start=<iso> end=<iso> waited_for_slot=<0|1>`,
# then `state: COMPLETED` when all completed.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
PORT=${PORT:-4299}
RUNS=${RUNS:-1}
TIMEOUT_S=${TIMEOUT_S:-1200}
export PREFECT_HOME=${PREFECT_HOME:-$(mktemp -d)}
mkdir -p "$PREFECT_HOME"
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
# An enqueued run asks for its slot again after this long (default 30 s).
export PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS=${SLOT_WAIT_S:-2}
export PREFECT_WORKER_QUERY_SECONDS=${PREFECT_WORKER_QUERY_SECONDS:-2}
export SEARCHRL_REPO_DIR=$PWD
export SEARCHRL_DATA_DIR=${SEARCHRL_DATA_DIR:-$PWD/runs/deploy}
LOG=$(mktemp -d)
KEEP_SERVER=${KEEP_SERVER:-0}
# A worker turns its first SIGTERM into a SIGINT to itself, which a background job of a
# script ignores: it would poll on forever. Its second SIGTERM is a SIGKILL.
stop_worker() {
  [ -n "${WORKER_PID:-}" ] || return 0
  kill "$WORKER_PID" 2>/dev/null || return 0
  for _ in 1 2 3 4 5; do kill -0 "$WORKER_PID" 2>/dev/null || return 0; sleep 1; done
  kill "$WORKER_PID" 2>/dev/null || true
}
cleanup() {
  stop_worker
  [ "$KEEP_SERVER" = 1 ] || kill "${SERVER_PID:-}" 2>/dev/null || true
}
trap cleanup EXIT

if ! curl -sf "$PREFECT_API_URL/health" >/dev/null 2>&1; then
  "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" >"$PREFECT_HOME/server.log" 2>&1 &
  SERVER_PID=$!
  echo "$SERVER_PID" >"$PREFECT_HOME/server.pid"
fi
for _ in $(seq 1 90); do
  curl -sf "$PREFECT_API_URL/health" >/dev/null 2>&1 && break
  sleep 1
done
curl -sf "$PREFECT_API_URL/health" >/dev/null || { cat "$PREFECT_HOME/server.log"; exit 1; }

"$BIN/prefect" work-pool create local-process --type process --overwrite >/dev/null
"$BIN/prefect" --no-prompt deploy --name searchrl-tiny-local >"$LOG/deploy.log" 2>&1 \
  || { cat "$LOG/deploy.log"; exit 1; }

# The deployment's overrides (its state paths) followed by this script's arguments.
PARAMS=$("$BIN/python" - "$@" <<'PY'
import asyncio, json, sys
from prefect.client.orchestration import get_client
async def main() -> None:
    async with get_client() as client:
        dep = await client.read_deployment_by_name("searchrl-pipeline/searchrl-tiny-local")
        print(json.dumps([*(dep.parameters.get("overrides") or []), *sys.argv[1:]]))
asyncio.run(main())
PY
)
RUN_IDS=()
for _ in $(seq 1 "$RUNS"); do
  RUN_OUT=$("$BIN/prefect" deployment run searchrl-pipeline/searchrl-tiny-local \
    --param "overrides=${PARAMS}")
  RUN_IDS+=("$(echo "$RUN_OUT" | grep -oE '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' | head -1)")
done
echo "flow runs ${RUN_IDS[*]}"

"$BIN/prefect" worker start --pool local-process >"$LOG/worker.log" 2>&1 &
WORKER_PID=$!
set +e
"$BIN/python" - "$TIMEOUT_S" "${RUN_IDS[@]}" <<'PY'
import asyncio, sys, time
from prefect.client.orchestration import get_client
async def main() -> int:
    deadline = time.monotonic() + float(sys.argv[1])
    async with get_client() as client:
        while True:
            runs = [await client.read_flow_run(i) for i in sys.argv[2:]]
            if all(r.state and r.state.is_final() for r in runs) or time.monotonic() > deadline:
                break
            await asyncio.sleep(2)
        for r in runs:
            states = await client.read_flow_run_states(r.id)
            waited = int(any(s.name == "AwaitingConcurrencySlot" for s in states))
            start = r.start_time.isoformat() if r.start_time else "-"
            end = r.end_time.isoformat() if r.end_time else "-"
            print(f"run {r.id} {r.state.type.value if r.state else 'NONE'} start={start} "
                  f"end={end} waited_for_slot={waited}")
    return 0 if all(r.state and r.state.is_completed() for r in runs) else 1
sys.exit(asyncio.run(main()))
PY
RC=$?
set -e
[ "$RC" = 0 ] || { tail -80 "$LOG/worker.log"; exit 1; }
echo "state: COMPLETED"
