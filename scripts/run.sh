#!/usr/bin/env bash
# The main job: the demo pipeline (embedded broker -> Spark -> warehouse, then the audit).
#   bash scripts/run.sh                      # headrace demo (installs the spark extra)
#   bash scripts/run.sh demo --duration 60   # with demo options
#   bash scripts/run.sh broker [options]     # only a broker on ./data, 127.0.0.1:9092
#   bash scripts/run.sh cluster [options]    # ZooKeeper + 3 brokers on 127.0.0.1:9092-9094
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-demo}" = "cluster" ]; then
  shift
  if [ ! -x /usr/share/zookeeper/bin/zkServer.sh ] && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "installing Debian's zookeeper package ..." >&2
    $SUDO apt-get update -qq >/dev/null 2>&1 || true
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper >/dev/null 2>&1 \
      || echo "warning: could not install zookeeper" >&2
  fi
  HEADRACE_SETUP_QUIET=1 bash scripts/setup.sh
  exec .venv/bin/headrace cluster "$@"
fi
if [ "${1:-demo}" = "broker" ]; then
  [ $# -gt 0 ] && shift
  HEADRACE_SETUP_QUIET=1 bash scripts/setup.sh
  exec .venv/bin/headrace broker --data-dir "${HEADRACE_DATA_DIR:-./data}" \
    --port "${HEADRACE_PORT:-9092}" "$@"
fi
[ "${1:-}" = "demo" ] && shift
HEADRACE_SETUP_QUIET=1 bash scripts/setup.sh spark
. scripts/spark-env.sh
exec .venv/bin/headrace demo "$@"
