#!/usr/bin/env bash
# `make run`: gatewayd with an embedded nats-server, plus one demo gateway-worker (kinds echo, sleep, fail).
# Ctrl-C (or SIGTERM) stops both, each by its PID.
set -euo pipefail
VENV=${VENV:-.venv}
export GW_DATA_DIR=${GW_DATA_DIR:-./var}
PORT=${GW_HTTP_PORT:-8080}
HOST=${GW_HTTP_HOST:-127.0.0.1}

"$VENV/bin/gatewayd" run &
GW_PID=$!
WK_PID=""
stop() {
  trap - INT TERM EXIT
  [ -n "$WK_PID" ] && kill -TERM "$WK_PID" 2>/dev/null || true
  [ -n "$WK_PID" ] && wait "$WK_PID" 2>/dev/null || true
  kill -TERM "$GW_PID" 2>/dev/null || true
  wait "$GW_PID" 2>/dev/null || true
}
trap stop INT TERM EXIT

for _ in $(seq 1 100); do
  if "$VENV/bin/python" - "$HOST" "$PORT" <<'PY' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/readyz", timeout=1)
PY
  kill -0 "$GW_PID" 2>/dev/null || { echo "gatewayd exited" >&2; exit 1; }
  sleep 0.2
done

"$VENV/bin/gateway-worker" --node-id demo-worker-1 --kinds echo,sleep,fail --data-dir "$GW_DATA_DIR" &
WK_PID=$!
echo "demo worker running (pid $WK_PID): kinds echo, sleep, fail"
echo "try: curl -s -X POST http://$HOST:$PORT/api/tasks -H \"Authorization: Bearer \$(cat $GW_DATA_DIR/admin.token)\" -d '{\"kind\":\"echo\",\"payload\":{\"hello\":\"world\"}}'"
wait "$GW_PID"
