#!/usr/bin/env bash
# Runs every test. Installs what the tests need first (Python packages into .venv with the
# test and spark extras, Java 17 for Spark, Debian's kcat, built on the old librdkafka
# 2.0.2 that real users still have, Debian's ZooKeeper for the cluster tests and Debian's
# Burrow, a sarama-based lag monitor, for the old-protocol tests; Debian's Chromium for the
# web console's browser test).
# Arguments go to pytest. Under CI=true a skipped test fails the run unless
# tests/conftest.py allows it (a missing kcat or ZooKeeper fails their tests).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=""
command -v kcat >/dev/null 2>&1 || missing="$missing kcat"
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || missing="$missing zookeeper"
command -v Burrow >/dev/null 2>&1 || missing="$missing burrow"
# Debian's Chromium for the web console's browser test (Playwright drives it; no download)
{ command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; } || missing="$missing chromium"
command -v curl >/dev/null 2>&1 || missing="$missing curl"
if [ -n "$missing" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null 2>&1 \
      || echo "warning: could not install$missing; their tests will fail under CI (skip elsewhere)" >&2
  fi
fi
bash scripts/setup.sh test,spark
. scripts/spark-env.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
