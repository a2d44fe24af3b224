#!/usr/bin/env bash
# Lint: ruff (pyflakes' rules and pycodestyle's errors, configured in ruff.toml) over the
# package, the tests and the scripts; then vulture for dead code in the package.
#
# vulture reads the tests and the scripts too, so code they call counts as used (the embedded
# server's test API, say); ci/vulture_whitelist.py names what Spark, Python, pytest, gRPC or
# our C call by name. At --min-confidence 60 vulture reports unused functions, methods,
# classes, attributes and variables; at 100 it would report only unreachable code and unused
# arguments. Runs from the venv of ci/setup.sh (ruff and vulture come with the test extras).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${VENV:-.venv}/bin"
if [ ! -x "$BIN/ruff" ] || [ ! -x "$BIN/vulture" ]; then
    echo "lint: $BIN has no ruff or vulture; run ci/setup.sh first" >&2
    exit 2
fi

status=0
"$BIN/ruff" check --output-format concise rocketmq_spark tests ci pyspark_rocketmq.py || status=1
"$BIN/vulture" rocketmq_spark tests ci pyspark_rocketmq.py ci/vulture_whitelist.py \
    --exclude "*_pb2.py,*_pb2_grpc.py" --min-confidence 60 || status=1
exit "$status"
