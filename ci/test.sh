#!/usr/bin/env bash
# Set up (ci/setup.sh) and run the whole test suite. Extra arguments go to pytest,
# for example: ci/test.sh -m slow   (the long soak, fuzz and benchmark-style runs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="$(ci/setup.sh)"
exec "$PY" -m pytest "$@"
