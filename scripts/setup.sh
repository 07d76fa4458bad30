#!/usr/bin/env bash
# Creates .venv and installs headrace with the given extras. Idempotent; needs only
# Python 3.11+, and apt for the system tools the tests use (Debian's kcat).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Nothing to do when this venv already has headrace installed from this pyproject.toml with
# these extras (the install is editable: source changes need no reinstall). run.sh calls
# this before every `broker`/`cluster`/demo start, which would otherwise re-run pip (10-16 s).
stamp=".venv/.headrace-setup-${extras:-base}"
# (setup.py and the C source too: the install compiles headrace._speedups)
digest() { { cat pyproject.toml setup.py src/headrace/_speedups.c; echo "extras=$1"
  .venv/bin/python --version; } \
  | sha256sum | cut -d' ' -f1; }
want="$(digest "$extras")"
# an install with more extras (the tests' test,spark) serves a call with fewer (run.sh's)
covered=""
for other in .venv/.headrace-setup-*; do
  [ -f "$other" ] || continue
  have="${other#.venv/.headrace-setup-}"; [ "$have" = base ] && have=""
  missing=""
  for e in ${extras//,/ }; do
    case ",$have," in *",$e,"*) ;; *) missing=1 ;; esac
  done
  if [ -z "$missing" ] && [ "$(cat "$other")" = "$(digest "$have")" ]; then covered=1; fi
done
if [ -x .venv/bin/headrace ] && [ -n "$covered" ]; then
  [ -n "${HEADRACE_SETUP_QUIET:-}" ] \
    || echo "setup: done (headrace${extras:+[$extras]} already installed in .venv)" >&2
  exit 0
fi
echo "setup: installing headrace${extras:+[$extras]} into .venv (the first time takes a" \
  "minute or so${extras:+; the spark extra downloads pyspark, ~300 MB}) ..." >&2
t0=$SECONDS
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q -e ".[$extras]"
else
  .venv/bin/python -m pip install -q -e .
fi
echo "$want" > "$stamp"
echo "setup: done in $((SECONDS - t0)) s" >&2
