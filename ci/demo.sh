#!/usr/bin/env bash
# Set up (ci/setup.sh) and run the demo against the embedded server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="$(ci/setup.sh)"
exec "$PY" -m rocketmq_spark.demo "$@"
