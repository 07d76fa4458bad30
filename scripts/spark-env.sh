# Sourced by run.sh and test.sh: Spark needs Java 17+ (installed with apt if missing) and
# this venv's Python for its workers.
if [ -z "${JAVA_HOME:-}" ]; then
  for d in /usr/lib/jvm/java-17-openjdk-* /usr/lib/jvm/java-21-openjdk-*; do
    [ -x "$d/bin/java" ] && { export JAVA_HOME="$d"; break; }
  done
fi
if [ -z "${JAVA_HOME:-}" ] && ! command -v java >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "spark-env: installing Java 17 (openjdk-17-jre-headless) with apt-get ..." >&2
  $SUDO apt-get update -qq >/dev/null 2>&1 || true
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless \
    >/dev/null 2>&1 || echo "warning: could not install Java 17; Spark needs it" >&2
fi
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PWD/.venv/bin/python}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
