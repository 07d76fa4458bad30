#!/usr/bin/env bash
# Runs every test: bash scripts/test.sh [--fast] [pytest arguments]
# Installs what the tests need first (Python packages into .venv with the test and spark
# extras, Java 17 for Spark, Debian's kcat, built on the old librdkafka 2.0.2 that real
# users still have, Debian's ZooKeeper for the cluster tests and Debian's Burrow, a
# sarama-based lag monitor, for the old-protocol tests; Debian's Chromium for the web
# console's browser test; iptables for the cluster's network-partition tests; without
# --fast, the Quix Streams and Faust virtualenvs of scripts/suites.sh).
#
# --fast runs only the fast tier (tests not marked slow: the pure cores, wire and protocol
# tests, fuzzers and property tests at a quarter of their budget, in-process and
# single-broker tests; under 5
# minutes on 2 cores), for use while developing. tests/conftest.py says which tests are
# slow, and why.
#
# Two passes: first every test that may run beside another (without --fast the slow ones
# too: clusters, kills and restarts, Spark, the demo), on HEADRACE_TEST_WORKERS
# pytest-xdist workers (default 2; 0 runs them in this process), longest units first
# (tests/conftest.py: XDIST_GROUPS, XDIST_UNIT_SECONDS); then, one at a time, the tests
# marked serial (they measure rates). Other arguments go to pytest, in both passes.
# Under CI=true a skipped test fails the run unless tests/conftest.py allows it (a missing
# kcat or ZooKeeper fails their tests).
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
args=()
for a in "$@"; do
  if [ "$a" = "--fast" ]; then fast=1; else args+=("$a"); fi
done
missing=""
command -v kcat >/dev/null 2>&1 || missing="$missing kcat"
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || missing="$missing zookeeper"
command -v Burrow >/dev/null 2>&1 || missing="$missing burrow"
# Debian's Chromium for the web console's browser test (Playwright drives it; no download)
{ command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; } || missing="$missing chromium"
command -v curl >/dev/null 2>&1 || missing="$missing curl"
# iptables: the network-partition tests cut loopback traffic per broker (owner match)
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
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
# the stream-processing libraries' venvs (slow tests only): Quix Streams and Faust pin
# packages differently from .venv (scripts/suites.sh). Built in the background while the
# tests run (each a few minutes of pip on a fresh machine); the tests that use one ask
# scripts/suites.sh for it, which waits for the build under its lock.
suites=()
if [ "$fast" = 0 ]; then
  bash scripts/suites.sh quix & suites+=($!)
  bash scripts/suites.sh faust & suites+=($!)
fi
. scripts/spark-env.sh
# cached bytecode (and pytest's rewritten test modules) halves collection, which every
# xdist worker does again; __pycache__ is git-ignored
unset PYTHONDONTWRITEBYTECODE
workers="${HEADRACE_TEST_WORKERS:-2}"
xdist=()
[ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist loadfile)
if [ "$fast" = 1 ]; then
  first=parallel; second=fast-serial
  # the fuzzers and the property tests (Hypothesis, tests/unit: tests/property_budget.py)
  # at a quarter of their budget (the full suite runs the whole budget)
  export PROPERTY_FRACTION="${PROPERTY_FRACTION:-0.25}"
  export FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-300}" FUZZ_TAGGED="${FUZZ_TAGGED:-750}" \
    FUZZ_SECONDS="${FUZZ_SECONDS:-6}" FUZZ_BATCH_EXAMPLES="${FUZZ_BATCH_EXAMPLES:-400}"
else
  first=unserial; second=serial
fi
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
set +e
"${pytest[@]}" --tier "$first" "${xdist[@]}" ${args[@]+"${args[@]}"}
rc1=$?
echo "scripts/test.sh: pass 2 of 2, one test at a time: --tier $second" >&2
"${pytest[@]}" --tier "$second" ${args[@]+"${args[@]}"}
rc2=$?
set -e
for pid in ${suites[@]+"${suites[@]}"}; do wait "$pid" || true; done
# 5 is "no test selected": fine for one pass (the arguments chose tests of the other)
for rc in "$rc1" "$rc2"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
if [ "$rc1" = 5 ] && [ "$rc2" = 5 ]; then exit 5; fi
exit 0
