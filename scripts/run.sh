#!/usr/bin/env bash
# The main job: a single-node broker on ./data, listening on 127.0.0.1:9092.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/headrace broker --data-dir "${HEADRACE_DATA_DIR:-./data}" --port "${HEADRACE_PORT:-9092}" "$@"
