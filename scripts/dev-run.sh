#!/usr/bin/env bash
# `make run`: gatewayd with an embedded nats-server, plus one demo gateway-worker (kinds echo, sleep, fail).
# Ctrl-C (or SIGTERM) stops both, each by its PID, in order: the worker first (it stops pulling, lets
# running handlers finish for up to GW_WORKER_GRACE_S, settles the rest failed-retryable), then gatewayd
# (then its NATS). A terminal sends Ctrl-C's SIGINT to its whole foreground process group; the two run in
# sessions of their own (setsid) so that only this script gets it and stops them in that order (were both
# interrupted at once, gatewayd and its NATS would be gone while the worker still had settles to send).
set -euo pipefail
VENV=${VENV:-.venv}
export GW_DATA_DIR=${GW_DATA_DIR:-./var}
PORT=${GW_HTTP_PORT:-8080}
HOST=${GW_HTTP_HOST:-127.0.0.1}
GRACE=${GW_WORKER_GRACE_S:-5}

setsid "$VENV/bin/gatewayd" run &
GW_PID=$!
echo "gatewayd running (pid $GW_PID)"
WK_PID=""
stop() {
  trap - INT TERM HUP EXIT
  echo "stopping: the worker (up to ${GRACE}s for running tasks), then gatewayd" >&2
  [ -n "$WK_PID" ] && kill -TERM "$WK_PID" 2>/dev/null || true
  [ -n "$WK_PID" ] && wait "$WK_PID" 2>/dev/null || true
  kill -TERM "$GW_PID" 2>/dev/null || true
  wait "$GW_PID" 2>/dev/null || true
}
trap stop INT TERM HUP EXIT  # HUP: the terminal closed (the setsid children would not get it)

for _ in $(seq 1 100); do
  if "$VENV/bin/python" - "$HOST" "$PORT" <<'PY' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/readyz", timeout=1)
PY
  kill -0 "$GW_PID" 2>/dev/null || { echo "gatewayd exited" >&2; exit 1; }
  sleep 0.2
done

setsid "$VENV/bin/gateway-worker" --node-id demo-worker-1 --kinds echo,sleep,fail --data-dir "$GW_DATA_DIR" \
  --shutdown-grace "$GRACE" &
WK_PID=$!
echo "demo worker running (pid $WK_PID): kinds echo, sleep, fail"
echo "try: curl -s -X POST http://$HOST:$PORT/api/tasks -H \"Authorization: Bearer \$(cat $GW_DATA_DIR/admin.token)\" -d '{\"kind\":\"echo\",\"payload\":{\"hello\":\"world\"}}'"
wait "$GW_PID"
