#!/usr/bin/env bash
# Virtualenvs of their own for the Python stream-processing libraries that the tests (and
# the README's Quix Streams example) run against headrace: bash scripts/suites.sh NAME...
#
#   quix   .venv-quix: quixstreams 3.28.1 (it needs confluent-kafka < 2.13; .venv pins 2.16)
#   faust  .venv-faust: faust-streaming 0.15.3 (it needs click < 8.4; .venv pins 8.5), with
#          the test tools its own suite uses and its source distribution (its tests are in
#          it) from the package index, checked against a pinned SHA-256 and unpacked in
#          .venv-faust/src/faust_streaming-0.15.3
#
# Idempotent: a venv whose stamp names the same pins is left as it is (a second run takes
# well under a second). Needs only Python 3.11+ and the package index, as scripts/setup.sh.
# Safe to run concurrently: each venv is built under a lock (.venv-NAME.lock), so a test
# that asks for a venv while scripts/test.sh builds it in the background waits for it.
set -euo pipefail
cd "$(dirname "$0")/.."
FAUST_SDIST=faust_streaming-0.15.3.tar.gz
FAUST_SDIST_SHA256=51d6de8d7984c1e47ce961ba4c066e82a6b69d7b02d6bc27129677c4bfb1235f
declare -A PINS=(
  [quix]="quixstreams==3.28.1"
  # pytest < 8 and pytest-asyncio 0.21 (its event_loop fixture): what faust's tests ask for
  [faust]="faust-streaming==0.15.3 pytest==7.4.4 pytest-asyncio==0.21.2 confluent-kafka==2.16.1"
)
[ "$#" -gt 0 ] || { echo "usage: bash scripts/suites.sh quix|faust ..." >&2; exit 2; }
for name in "$@"; do
  pins="${PINS[$name]:-}"
  [ -n "$pins" ] || { echo "suites: no suite named $name (quix, faust)" >&2; exit 2; }
  venv=".venv-$name"
  stamp="$venv/.headrace-pins"
  want="$pins"
  [ "$name" != faust ] || want="$pins $FAUST_SDIST_SHA256"
  exec 9>"$venv.lock"
  flock 9
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exec 9>&-
    continue
  fi
  echo "suites: installing $pins into $venv (the first time takes a minute or two) ..." >&2
  t0=$SECONDS
  rm -rf "$venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install -q $pins
  if [ "$name" = faust ]; then
    mkdir -p "$venv/src"
    "$venv/bin/python" -m pip download -q --no-deps --no-binary faust-streaming \
      "faust-streaming==0.15.3" -d "$venv/src"
    echo "$FAUST_SDIST_SHA256  $venv/src/$FAUST_SDIST" | sha256sum -c --quiet - \
      || { echo "suites: $FAUST_SDIST does not have the pinned SHA-256" >&2; exit 1; }
    tar -xzf "$venv/src/$FAUST_SDIST" -C "$venv/src"
  fi
  echo "$want" > "$stamp"
  exec 9>&-
  echo "suites: $venv done in $((SECONDS - t0)) s" >&2
done
