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
# Reinstall when the metadata or the C accelerator changes (the editable install builds
# native/ once; a stale library would silently leave the pure-Python fallback in use).
stamp="$VENV/.installed-$(find native -name '*.[ch]' | LC_ALL=C sort | xargs cat setup.cfg pyproject.toml setup.py | sha1sum | cut -c1-12)"
if [ ! -e "$stamp" ]; then
    echo "setup: installing rocketmq-spark with its test extras into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    # An editable install that puts the checkout itself on sys.path (setup.cfg's package_dir
    # makes it so), so PySpark finds the top-level pyspark_rocketmq module: its data source
    # lookup scans sys.path, not import hooks.
    "$VENV/bin/python" -m pip install --quiet -e ".[test]" >&2
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi

# The official gRPC client (PyPI rocketmq-python-client 5.1.2), conformance peer of the 5.x
# proxy transport. It installs a top-level "rocketmq" package, like the C++ client in $VENV, so
# it gets a venv of its own, driven from a subprocess by tests/grpc_peer.py. When it cannot be
# installed (no network), its tests skip and say why.
GRPC_PEER_VENV="${GRPC_PEER_VENV:-.venv-grpc-peer}"
GRPC_PEER_PACKAGE="rocketmq-python-client==5.1.2"
if [ ! -e "$GRPC_PEER_VENV/.installed-5.1.2" ]; then
    echo "setup: installing $GRPC_PEER_PACKAGE into $GRPC_PEER_VENV" >&2
    if { [ -x "$GRPC_PEER_VENV/bin/python" ] || "$PYTHON" -m venv "$GRPC_PEER_VENV"; } >&2 \
            && "$GRPC_PEER_VENV/bin/python" -m pip install --quiet "$GRPC_PEER_PACKAGE" >&2; then
        touch "$GRPC_PEER_VENV/.installed-5.1.2"
    else
        echo "setup: could not install $GRPC_PEER_PACKAGE; the gRPC conformance tests will skip" >&2
    fi
fi
echo "$VENV/bin/python"
