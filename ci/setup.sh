#!/usr/bin/env bash
# Set up everything the demo and the tests need, from a fresh clone:
#   - Java 17+ (Spark needs it): installed with apt-get when missing and running as root;
#   - a virtual environment in .venv with this package and its test extras.
# Idempotent: a second run only checks. Source it or run it; it prints the venv's python path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

java_major() {
    command -v java >/dev/null 2>&1 || { echo 0; return; }
    java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1") ? v[2] : v[1]; exit}'
}

if [ "$(java_major)" -lt 17 ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: Java 17+ not found; installing openjdk-17-jre-headless" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >&2
    else
        echo "setup: Spark needs Java 17 or newer, and none was found on PATH." >&2
        echo "       Install a JDK or JRE 17+ (for example: sudo apt-get install openjdk-17-jre-headless)" >&2
        echo "       or set JAVA_HOME and put \$JAVA_HOME/bin on PATH, then run this again." >&2
        exit 1
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat setup.cfg pyproject.toml | sha1sum | cut -c1-12)"
if [ ! -e "$stamp" ]; then
    echo "setup: installing rocketmq-spark with its test extras into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    # "compat" puts the checkout itself on sys.path, so PySpark finds the top-level
    # pyspark_rocketmq module (its data source lookup scans sys.path, not import hooks).
    "$VENV/bin/python" -m pip install --quiet -e ".[test]" --config-settings editable_mode=compat >&2
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi
echo "$VENV/bin/python"
