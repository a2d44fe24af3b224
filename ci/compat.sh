#!/usr/bin/env bash
# Run the Spark-compatibility subset of the tests on an older Spark:
#   ci/compat.sh 4.0   or   ci/compat.sh 4.1   [extra pytest arguments]
# The subset (COMPAT_TESTS below): reads, streams (AvailableNow, restart from a checkpoint,
# exactly once), the sink and the exactly-once sink, group membership, the lag listener, and
# tests/test_spark_versions.py, which checks each fallback for what the older Spark lacks.
#
# Each Spark gets a venv of its own, .venv-spark<minor> (or $COMPAT_VENV_ROOT/.venv-spark<minor>),
# with pyspark pinned to the newest patch of that minor and the package's requirements and test
# extras from setup.cfg; the checkout goes on its sys.path through a .pth file, as the editable
# install of ci/setup.sh does (PySpark's data source lookup scans sys.path). pip's cache keeps
# a second creation quick. The whole suite runs on the newest Spark (ci/test.sh, .venv).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MINOR="${1:-}"
case "$MINOR" in
    4.0) PYSPARK="pyspark==4.0.5" ;;
    4.1) PYSPARK="pyspark==4.1.4" ;;
    *) echo "usage: ci/compat.sh 4.0|4.1 [pytest arguments]  (Spark 4.2 and 4.3: ci/test.sh)" >&2
       exit 2 ;;
esac
shift

COMPAT_TESTS=(
    tests/test_spark_versions.py
    tests/test_source_batch.py::test_batch_read_defaults_to_earliest_through_latest
    tests/test_source_batch.py::test_ending_offsets_and_ending_timestamp
    tests/test_source_batch.py::test_register_works_as_well_as_discovery
    tests/test_source_pushdown.py::test_without_pushdown_spark_reads_and_filters_everything
    tests/test_source_arrow.py::test_spark_reads_the_batches
    tests/test_source_stream.py::test_checkpointed_query_restarts_exactly_once_into_parquet
    tests/test_source_stream.py::test_batch_0_replay_keeps_a_start_resolved_from_group_offsets
    tests/test_source_stream.py::test_starting_offsets_latest_reads_only_new_messages
    tests/test_source_lag.py::test_offsets_behind_counts_queues_in_both_offsets_only
    tests/test_sink_spark.py::test_rows_without_a_sharding_key_spread_over_every_queue
    tests/test_sink_stream.py::test_read_transform_write_restarts_from_its_checkpoint
)

PYTHON="${PYTHON:-python3}"
VENV="${COMPAT_VENV_ROOT:-.}/.venv-spark$MINOR"
started=$SECONDS

ci/setup.sh >/dev/null  # Java 17+ (and the main venv, which builds the C extensions)

# Reinstall when the requirements or the pin change.
stamp="$VENV/.installed-$(echo "$PYSPARK" | cat - setup.cfg | sha1sum | cut -c1-12)"
if [ ! -e "$stamp" ]; then
    echo "compat: installing $PYSPARK with the requirements and test extras into $VENV" >&2
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    # The requirement lines of setup.cfg (install_requires and the test extras), comments out.
    mapfile -t requirements < <("$VENV/bin/python" - <<'EOF'
import configparser
cfg = configparser.ConfigParser(interpolation=None)
cfg.read("setup.cfg")
for text in (cfg["options"]["install_requires"], cfg["options.extras_require"]["test"]):
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            print(line)
EOF
)
    "$VENV/bin/python" -m pip install -qq --upgrade pip setuptools wheel >&2
    "$VENV/bin/python" -m pip install -qq "${requirements[@]}" "$PYSPARK" >&2
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi

# The checkout on the venv's sys.path (rewritten each run: the checkout may have moved).
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$PWD" > "$site/rocketmq_spark_checkout.pth"

# The C extensions: the in-tree ones serve when they were built for this interpreter.
if ! "$VENV/bin/python" -c "import rocketmq_spark.client._native, rocketmq_spark.embedded._native" \
        2>/dev/null; then
    echo "compat: building the C extensions for $VENV's python" >&2
    "$VENV/bin/python" setup.py build_ext --inplace -q >&2
fi

version="$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
echo "compat: Spark $version, venv ready in $((SECONDS - started)) s" >&2

export PYSPARK_PYTHON="$VENV/bin/python" PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
status=0
"$VENV/bin/python" -m pytest -p no:cacheprovider "${COMPAT_TESTS[@]}" "$@" || status=$?
echo "compat: Spark $version subset finished in $((SECONDS - started)) s (exit $status)" >&2
exit "$status"
