#!/bin/sh
# The operator tools the ops tests run (tests/ops): promtool (Debian's prometheus package),
# systemd-analyze (systemd) and openssl. `make test` calls this first. It installs only what is
# missing, and only as root with apt-get (a fresh CI machine); elsewhere it says what to install and
# leaves the tests to fail with the same hint (GW_ALLOW_MISSING_TOOLS=1 turns those checks into skips).
# Debian's prometheus package also ships a Prometheus service: it is not started here, since
# containers deny service starts (policy-rc.d); on a systemd host, stop it if you do not want it.
set -eu
missing=""
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
command -v systemd-analyze >/dev/null 2>&1 || missing="$missing systemd"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-ops-tools: missing:$missing; install them (Debian: apt-get install$missing)" >&2
  exit 0
fi
echo "ensure-ops-tools: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # one word per package
apt-get install -y -qq --no-install-recommends $missing >/dev/null
