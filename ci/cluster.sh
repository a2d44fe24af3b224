#!/usr/bin/env bash
# The demo on a real Spark standalone cluster, deployed the way a user deploys it.
#
# A master and two workers start from pyspark's own launcher (bin/spark-class), on loopback and
# free ports, in an environment that cannot import rocketmq_spark: no PYTHONPATH, no venv on
# PATH, every process started in the work folder. spark-submit (client mode) then runs
# rocketmq_spark/demo.py, which checks exactly once and the offsets committed back to the
# consumer group, with the package shipped in one or both of two ways:
#
#   venv     a packed virtual environment (venv-pack) with the package and its dependencies,
#            --archives rocketmq-spark-env.tar.gz#environment, and PYSPARK_PYTHON set to
#            ./environment/bin/python for every Python process: the driver's (the same archive
#            unpacked in the folder spark-submit runs from) and the executors';
#   pyfiles  the package's wheel renamed rocketmq_spark.zip, --py-files, for nodes whose Python
#            has the dependencies but not the package, with PYTHONPATH=rocketmq_spark.zip: a
#            relative path, which means the local copy for the driver's processes and the shipped
#            one in each executor's working folder. The package runs without its C extensions
#            there (Python cannot load them from a zip).
#
# No Python that has the package installed is named anywhere in spark-submit's environment, and
# the Pythons the nodes have are checked not to import it, so a run cannot pass by accident.
# The master, the workers and everything they started are stopped on every exit (a trap); the
# logs stay in the work folder, which is printed and kept on failure.
#
#   ci/cluster.sh [--ship venv|pyfiles|both] [--out DIR] [--keep] [-- demo arguments]
#
# --out DIR: copy each way's summary (DIR/<way>.json), its spark-submit exit code
# (DIR/<way>.rc) and evidence of what the executors imported (DIR/<way>.evidence) there;
# --keep: keep the work folder after a success too. PY=<python> skips ci/setup.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

SHIP=both
OUT=""
KEEP=0
DEMO_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --ship) SHIP="${2:?--ship needs venv, pyfiles or both}"; shift 2 ;;
        --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --) shift; DEMO_ARGS=("$@"); break ;;
        *) echo "cluster: unknown argument '$1' (usage: see the top of $0)" >&2; exit 2 ;;
    esac
done
case "$SHIP" in
    venv|pyfiles) WAYS=("$SHIP") ;;
    both) WAYS=(venv pyfiles) ;;
    *) echo "cluster: --ship must be venv, pyfiles or both, not '$SHIP'" >&2; exit 2 ;;
esac
[ ${#DEMO_ARGS[@]} -gt 0 ] || DEMO_ARGS=(--messages 2000 --show 3)
if [ -n "$OUT" ]; then mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"; fi

PY="${PY:-$(ci/setup.sh)}"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
fail() { echo "cluster: $*" >&2; exit 1; }
command -v java >/dev/null || fail "Spark needs Java 17+ on PATH (ci/setup.sh installs it)"
"$PY" -c 'import venv_pack' 2>/dev/null || fail "$PY lacks venv-pack (it is in the test extra)"
git rev-parse --git-dir >/dev/null 2>&1 || fail "run it in a git checkout (it ships one)"
SPARK_HOME="$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
BASE_PYTHON="$("$PY" -c 'import sys; print(sys._base_executable)')"
JAVA_BIN="$(dirname "$(readlink -f "$(command -v java)")")"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/rocketmq-spark-cluster.XXXXXX")"
LOGS="$WORK/logs"
mkdir -p "$LOGS" "$WORK/conf" "$WORK/work" "$WORK/local" "$WORK/tmp" "$WORK/submit" "$WORK/app"
PIDS=()

log() { echo "cluster: $*"; }

descendants() {  # every live descendant of the given pids
    local pid child
    for pid in "$@"; do
        for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do
            echo "$child"
            descendants "$child"
        done
    done
}

stop_all() {
    # Each daemon and each spark-submit leads a process group of its own (setsid); executors
    # stay in their worker's group, but pyspark's Python daemons make groups of their own, so
    # every descendant is listed before the first signal and signalled by its id.
    [ ${#PIDS[@]} -gt 0 ] || return 0
    local all pid alive tries=0
    all="$(descendants "${PIDS[@]}") ${PIDS[*]}"
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for pid in $all; do kill -TERM "$pid" 2>/dev/null || true; done
    while [ $tries -lt 150 ]; do  # up to 30 s for a clean stop
        alive=0
        for pid in $all; do if kill -0 "$pid" 2>/dev/null; then alive=1; fi; done
        [ $alive = 1 ] || break
        sleep 0.2; tries=$((tries + 1))
    done
    for pid in $all; do kill -KILL "$pid" 2>/dev/null || true; done
    PIDS=()
}

finish() {
    local rc=$?
    trap - EXIT INT TERM
    stop_all
    if [ $rc -ne 0 ]; then
        echo "cluster: FAILED (exit $rc); logs in $LOGS (work folder $WORK kept)" >&2
        local f
        for f in "$LOGS"/*.log "$WORK"/work/app-*/*/stderr "$LOGS"/*.out; do  # the demo's last
            [ -s "$f" ] || continue
            echo "----- ${f#"$WORK"/}: last lines other than INFO" >&2
            grep -v ' INFO ' "$f" | tail -n 25 >&2 || true
        done
    elif [ $KEEP = 0 ]; then
        rm -rf "$WORK"
    else
        log "work folder kept: $WORK"
    fi
    exit $rc
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_for() {  # wait_for SECONDS PID FILE PATTERN [COUNT]: until FILE has COUNT matching lines
    local deadline=$((SECONDS + $1)) pid="$2" file="$3" pattern="$4" count="${5:-1}" found
    while found=$(grep -c -- "$pattern" "$file" 2>/dev/null) || found=0
          [ "$found" -lt "$count" ]; do
        kill -0 "$pid" 2>/dev/null || fail "process $pid exited, see $file"
        [ $SECONDS -lt $deadline ] || fail "no '$pattern' in $file after $1 s"
        sleep 0.2
    done
}

# ---- 1. what is shipped: the wheel, a packed venv, a Python with the dependencies only
started=$SECONDS
log "work folder $WORK"
mkdir -p "$WORK/src"
git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$WORK/src"
cp "$ROOT/rocketmq_spark/demo.py" "$WORK/app/demo.py"  # the application spark-submit runs
"$PY" -m pip wheel --quiet --no-deps -w "$WORK/dist" "$WORK/src" >"$LOGS/build.log" 2>&1
WHEEL="$(ls "$WORK"/dist/rocketmq_spark-*.whl)"
# The dependencies the wheel declares, less pyspark: a cluster brings its own (its pyspark.zip
# comes first on every Python worker's path), and it weighs 490 MB.
"$PY" - "$WHEEL" >"$WORK/requirements.txt" <<'EOF'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    fields = Parser().parsestr(wheel.read(meta).decode())
for req in fields.get_all("Requires-Dist"):
    if "extra ==" not in req and not req.replace(" ", "").lower().startswith("pyspark"):
        print(req)
EOF
ENV_DIR="$WORK/env"
"$BASE_PYTHON" -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install --quiet -r "$WORK/requirements.txt" >>"$LOGS/build.log" 2>&1
# --no-compile: the package ships without .pyc files, so the ones the executors write when
# they import it show where it was imported from (the evidence below).
"$ENV_DIR/bin/python" -m pip install --quiet --no-deps --no-compile "$WHEEL" \
    >>"$LOGS/build.log" 2>&1
ARCHIVE="$WORK/rocketmq-spark-env.tar.gz"
"$PY" -m venv_pack --prefix "$ENV_DIR" --output "$ARCHIVE" --quiet
# The same venv without the package: the nodes' Python for the pyfiles way.
"$ENV_DIR/bin/python" -m pip uninstall --quiet --yes rocketmq-spark >>"$LOGS/build.log" 2>&1
DEPS_PYTHON="$ENV_DIR/bin/python"
log "built $(basename "$WHEEL") and $(basename "$ARCHIVE")" \
    "($(du -m "$ARCHIVE" | cut -f1) MB) in $((SECONDS - started)) s"

# Everything runs from the work folder: a Python started in the checkout would import the
# package from it (the current folder is on sys.path for -c and -m).
cd "$WORK/submit"
NODE_PATH="$JAVA_BIN:/usr/bin:/bin"
for python in python3 "$DEPS_PYTHON" "$BASE_PYTHON"; do
    for module in rocketmq_spark pyspark_rocketmq; do
        if env -i "PATH=$NODE_PATH" "$python" -c "import $module" 2>/dev/null; then
            fail "$python imports $module here: a run would prove nothing"
        fi
    done
done

# ---- 2. the cluster: a master and two workers of one core each, on free ports
cat > "$WORK/conf/log4j2.properties" <<'EOF'
rootLogger.level = info
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
EOF
# What a fresh node has: Java and the system's tools on PATH, no PYTHONPATH, no venv.
NODE_ENV=(env -i "HOME=${HOME:-$WORK}" "PATH=$NODE_PATH" "SPARK_HOME=$SPARK_HOME"
          "TMPDIR=$WORK/tmp" "SPARK_CONF_DIR=$WORK/conf" "SPARK_LOCAL_IP=127.0.0.1"
          "SPARK_LOCAL_DIRS=$WORK/local")
[ -z "${JAVA_HOME:-}" ] || NODE_ENV+=("JAVA_HOME=$JAVA_HOME")

start() {  # start NAME CLASS ARGS...: a daemon leading its own process group, output to LOGS
    local name="$1"; shift
    setsid "${NODE_ENV[@]}" "$SPARK_HOME/bin/spark-class" "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
    PIDS+=($!)
    STARTED_PID=$!
}

started=$SECONDS
start master org.apache.spark.deploy.master.Master --host 127.0.0.1 --port 0 --webui-port 0
MASTER_PID=$STARTED_PID
wait_for 120 "$MASTER_PID" "$LOGS/master.log" "Starting Spark master at spark://"
MASTER_URL="$(grep -o 'spark://[0-9.]*:[0-9]*' "$LOGS/master.log" | head -n 1)"
for n in 1 2; do
    start "worker-$n" org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --port 0 \
        --webui-port 0 --cores 1 --memory 1g --work-dir "$WORK/work" "$MASTER_URL"
done
wait_for 120 "$MASTER_PID" "$LOGS/master.log" "Registering worker" 2
log "master $MASTER_URL and 2 workers up in $((SECONDS - started)) s"

# ---- 3. spark-submit in client mode: the driver runs here, the executors on the workers
evidence() {  # what the executors of the last application had and imported, one line each
    local app executor name shipped
    app="$(find "$WORK/work" -mindepth 1 -maxdepth 1 -name 'app-*' | sort | tail -n 1)"
    [ -n "$app" ] || return 0  # the application never reached the master
    for executor in "$app"/*/; do
        shipped=""
        for name in environment rocketmq_spark.zip; do
            [ ! -e "$executor/$name" ] || shipped="${shipped:+$shipped,}$name"
        done
        printf '%s tasks=%s shipped=%s pyc=%s\n' "$(basename "$executor")" \
            "$(grep -c 'Running task' "$executor/stderr" || true)" "$shipped" \
            "$(find "$executor" -path '*site-packages/rocketmq_spark/*' -name '*.pyc' | wc -l)"
    done
}

submit() {  # submit WAY PYTHON [VARIABLE=VALUE...] -- [SPARK-SUBMIT OPTIONS...]
    local way="$1" python="$2" rc=0 started=$SECONDS
    shift 2
    local variables=()
    while [ "$1" != "--" ]; do variables+=("$1"); shift; done
    shift
    # PYSPARK_PYTHON is the one Python of every Python process: the driver's (spark-submit
    # falls back to it), the data source's on the driver, and the executors'. It is not
    # PYSPARK_DRIVER_PYTHON: Spark runs a data source found through its pyspark_* module with
    # that variable's Python everywhere, executors included (docs/deploying.md).
    setsid "${NODE_ENV[@]}" "PYSPARK_PYTHON=$python" "${variables[@]}" \
        "$SPARK_HOME/bin/spark-submit" --master "$MASTER_URL" --deploy-mode client \
        --name "rocketmq-spark-demo-$way" --conf spark.cores.max=2 \
        --conf spark.executor.cores=1 --conf spark.executor.memory=768m \
        --conf "spark.driver.extraJavaOptions=-Djava.io.tmpdir=$WORK/tmp" \
        "$@" "$WORK/app/demo.py" "${DEMO_ARGS[@]}" --json "$WORK/$way.json" \
        >"$LOGS/$way.out" 2>"$LOGS/$way.log" </dev/null &
    PIDS+=($!)
    wait $! || rc=$?
    log "$way: spark-submit exited $rc after $((SECONDS - started)) s"
    evidence > "$WORK/$way.evidence"
    if [ -n "$OUT" ]; then
        echo "$rc" > "$OUT/$way.rc"
        cp "$WORK/$way.evidence" "$OUT/"
        [ ! -f "$WORK/$way.json" ] || cp "$WORK/$way.json" "$OUT/"
    fi
    cat "$LOGS/$way.out"
    sed 's/^/cluster: executor /' "$WORK/$way.evidence"
    return $rc
}

for way in "${WAYS[@]}"; do
    case "$way" in
        venv)
            # In client mode the driver's Python processes run on this machine, in this
            # folder: the same archive unpacked here gives ./environment/bin/python a meaning.
            mkdir -p environment
            tar -xzf "$ARCHIVE" -C environment
            submit venv ./environment/bin/python -- --archives "$ARCHIVE#environment"
            ;;
        pyfiles)
            # A relative PYTHONPATH: Spark hands the driver's PYTHONPATH to the executors of a
            # data source it found through pyspark_rocketmq, and there it must mean their copy.
            cp "$WHEEL" rocketmq_spark.zip  # pyspark puts only .zip, .egg and .jar on sys.path
            submit pyfiles "$DEPS_PYTHON" PYTHONPATH=rocketmq_spark.zip -- \
                --py-files rocketmq_spark.zip
            ;;
    esac
done
