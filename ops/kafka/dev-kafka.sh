#!/usr/bin/env bash
# Development Apache Kafka broker for tests: one KRaft node (broker and
# controller in a single JVM) on loopback, fresh state on every start.
#
#   ops/kafka/dev-kafka.sh start    # download (first time), format, start, wait until ready;
#                                   # prints "started", or "already-running" if it was
#   ops/kafka/dev-kafka.sh stop     # SIGTERM, then SIGKILL after a grace period
#   ops/kafka/dev-kafka.sh status   # exit 0 if running, 3 if stopped
#
# Outages for tests (the broker keeps its data, listeners and credentials):
#   ops/kafka/dev-kafka.sh pause    # SIGSTOP: connections stay open, nothing answers
#   ops/kafka/dev-kafka.sh resume   # SIGCONT
#   ops/kafka/dev-kafka.sh restart  # stop, then start again on the same data
#
# Environment:
#   KAFKA_PORT             client (PLAINTEXT) port            default 9092
#   KAFKA_CONTROLLER_PORT  KRaft controller port              default 9093
#   KAFKA_SASL_SSL_PORT    SASL_SSL client port (SCRAM, PLAIN) default KAFKA_PORT + 2
#   KAFKA_SSL_PORT         SSL client port (mutual TLS)        default KAFKA_PORT + 3
#   VIGIL_KAFKA_HOME       jar cache (outside the git tree)   default ~/.cache/vigil/kafka
#   VIGIL_KAFKA_RUN        run dir: config, data, logs, pid   default /tmp/vigil-kafka-$KAFKA_PORT
#   KAFKA_START_TIMEOUT    seconds to wait for readiness      default 90
#   KAFKA_HEAP_OPTS        broker heap flags                  default "-Xms512m -Xmx1g"
#   JAVA_HOME              Java 17+ to use (else `java` on PATH)
#
# The Kafka version is the kafka.version property in pom.xml next to this script.
#
# Every start makes a fresh dev CA, a broker certificate for 127.0.0.1 and localhost, a
# client certificate (mutual TLS) and a random password for the SASL user "vigil"
# (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN), all in the run dir; <run dir>/security.json
# lists the secured listeners and those files for clients.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$SCRIPT_DIR/pom.xml"
TEMPLATE="$SCRIPT_DIR/server.properties.in"
LOG4J_CONFIG="$SCRIPT_DIR/log4j2.properties"
READY_SRC="$SCRIPT_DIR/KafkaReady.java"

HOST=127.0.0.1
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_SASL_SSL_PORT="${KAFKA_SASL_SSL_PORT:-}"
KAFKA_SSL_PORT="${KAFKA_SSL_PORT:-}"
SASL_USER=vigil
VIGIL_KAFKA_HOME="${VIGIL_KAFKA_HOME:-$HOME/.cache/vigil/kafka}"
VIGIL_KAFKA_RUN="${VIGIL_KAFKA_RUN:-/tmp/vigil-kafka-$KAFKA_PORT}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g}"
STOP_TIMEOUT=30

RUN_DIR="$VIGIL_KAFKA_RUN"
PID_FILE="$RUN_DIR/kafka.pid"
BROKER_LOG="$RUN_DIR/kafka.log"
SERVER_PROPERTIES="$RUN_DIR/server.properties"
TLS_DIR="$RUN_DIR/tls"
SASL_PASSWORD_FILE="$RUN_DIR/sasl-password"
SECURITY_JSON="$RUN_DIR/security.json"
RUN_MARKER=".vigil-dev-kafka"

log() { printf 'dev-kafka: %s\n' "$*" >&2; }
die() { printf 'dev-kafka: error: %s\n' "$*" >&2; exit 1; }

usage() {
    echo "usage: $(basename "$0") start|stop|status|pause|resume|restart" >&2
    exit 2
}

check_port_var() {
    local name=$1 value=$2
    if [[ ! "$value" =~ ^[0-9]+$ ]] || (( value < 1 || value > 65535 )); then
        die "$name must be a TCP port number, got '$value'"
    fi
}

kafka_version() {
    local v
    v="$(sed -n 's:.*<kafka\.version>[[:space:]]*\([^<[:space:]]*\)[[:space:]]*</kafka\.version>.*:\1:p' "$POM" | head -n 1)"
    [[ -n "$v" ]] || die "cannot read <kafka.version> from $POM"
    printf '%s\n' "$v"
}

# sha256 of a file, first 16 hex digits (used to notice edits of pom.xml etc.).
file_hash() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -c1-16
    else
        shasum -a 256 "$1" | cut -c1-16
    fi
}

# ---------------------------------------------------------------- java ----

find_java() {
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        JAVA="$JAVA_HOME/bin/java"
        JAVAC="$JAVA_HOME/bin/javac"
        [[ -x "$JAVAC" ]] || JAVAC=""
    elif command -v java >/dev/null 2>&1; then
        JAVA="$(command -v java)"
        JAVAC="$(command -v javac || true)"
    else
        die "java not found (set JAVA_HOME or put java on PATH); Kafka $KAFKA_VERSION needs Java 17 or newer"
    fi
    local out major minor
    out="$("$JAVA" -version 2>&1)" || die "'$JAVA -version' failed: $out"
    # First quoted token: "17.0.15", "21", "1.8.0_402", ...
    major="$(printf '%s\n' "$out" | sed -n 's/.*version "\([0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -n 1)"
    read -r major minor <<<"$major"
    if [[ "${major:-}" == 1 ]]; then major="${minor:-}"; fi
    [[ "${major:-}" =~ ^[0-9]+$ ]] || die "cannot tell the Java version from '$JAVA -version': $out"
    (( major >= 17 )) || die "Java $major found at $JAVA; Kafka $KAFKA_VERSION needs Java 17 or newer"
}

# --------------------------------------------------------------- jars -----

# Makes sure the jar cache for this Kafka version is complete (downloading it
# with Maven the first time) and that the readiness probe is compiled.
# Concurrent starts (e.g. on two ports) share the cache, so this runs under a
# lock when flock(1) is available.
prepare_cache() {
    VERSION_DIR="$VIGIL_KAFKA_HOME/$KAFKA_VERSION"
    LIB_DIR="$VERSION_DIR/lib"
    mkdir -p "$VERSION_DIR"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$VERSION_DIR/.lock"
        flock 9
    fi
    ensure_jars
    ensure_ready_probe
    if command -v flock >/dev/null 2>&1; then
        exec 9>&-
    fi
}

# Fills LIB_DIR with the broker and all its runtime jars unless it already
# holds the set for the current pom.xml.
ensure_jars() {
    local stamp="$VERSION_DIR/.complete" want
    want="$(file_hash "$POM")"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -f "$LIB_DIR/kafka_2.13-$KAFKA_VERSION.jar" ]]; then
        return 0
    fi

    command -v mvn >/dev/null 2>&1 \
        || die "mvn (Apache Maven) not found on PATH; it is needed once to download Kafka $KAFKA_VERSION into $VIGIL_KAFKA_HOME"

    log "downloading Apache Kafka $KAFKA_VERSION and its runtime dependencies from Maven Central into $VERSION_DIR"
    local staging="$VERSION_DIR/lib.tmp.$$" mvn_log="$VERSION_DIR/mvn.log"
    rm -rf "$staging"
    cp "$POM" "$VERSION_DIR/pom.xml"
    if ! mvn -B -q -Dstyle.color=never -f "$VERSION_DIR/pom.xml" \
            dependency:copy-dependencies \
            -DincludeScope=runtime \
            -DoutputDirectory="$staging" >"$mvn_log" 2>&1; then
        rm -rf "$staging"
        # Maven's output, minus terminal colour codes.
        sed -e $'s/\x1b\\[[0-9;]*m//g' "$mvn_log" >&2
        die "Maven could not download Kafka $KAFKA_VERSION (Maven error above, also in $mvn_log)"
    fi
    if [[ ! -f "$staging/kafka_2.13-$KAFKA_VERSION.jar" ]]; then
        rm -rf "$staging"
        die "Maven finished but kafka_2.13-$KAFKA_VERSION.jar is not among the downloaded jars"
    fi

    rm -rf "$LIB_DIR"
    mv "$staging" "$LIB_DIR"
    printf '%s\n' "$want" >"$stamp"
    log "cached $(find "$LIB_DIR" -name '*.jar' | wc -l | tr -d ' ') jars in $LIB_DIR"
}

# Sets READY_CLASSES to a directory holding the compiled readiness probe, or
# to "" when no javac is available (start then falls back to waiting for the
# broker's "Kafka Server started" log line once the port accepts connections).
ensure_ready_probe() {
    READY_CLASSES=""
    [[ -n "$JAVAC" ]] || return 0
    local dir
    dir="$VERSION_DIR/probe-$(file_hash "$READY_SRC")"
    if [[ ! -f "$dir/KafkaReady.class" ]]; then
        local tmp="$dir.tmp.$$"
        rm -rf "$tmp" "$dir"
        mkdir -p "$tmp"
        "$JAVAC" -nowarn -d "$tmp" -cp "$LIB_DIR/*" "$READY_SRC" >&2 \
            || { rm -rf "$tmp"; die "could not compile $READY_SRC"; }
        mv "$tmp" "$dir"
    fi
    READY_CLASSES="$dir"
}

# ------------------------------------------------------------ process -----

# Prints the pids of the broker that belongs to this run dir: the one in the
# pid file (if it still is a Kafka broker) plus any Kafka process started with
# this run dir's server.properties (in case the pid file was lost).
broker_pids() {
    local pid args
    if [[ -f "$PID_FILE" ]]; then
        pid="$(tr -dc '0-9' <"$PID_FILE")"
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            args="$(ps -p "$pid" -o args= 2>/dev/null || true)"
            if [[ "$args" == *kafka.Kafka* ]]; then
                printf '%s\n' "$pid"
            fi
        fi
    fi
    # pgrep -f would treat the path as a regular expression; match it literally.
    # shellcheck disable=SC2009
    ps -eo pid=,args= 2>/dev/null \
        | grep -F "kafka.Kafka $SERVER_PROPERTIES" \
        | grep -v -F 'grep' \
        | awk '{print $1}' || true
}

running_pids() { broker_pids | sort -u | sed '/^$/d'; }

port_open() {
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

tail_log() {
    if [[ -s "$BROKER_LOG" ]]; then
        echo "---- last 40 lines of $BROKER_LOG ----" >&2
        tail -n 40 "$BROKER_LOG" >&2
        echo "----" >&2
    fi
}

# Terminates the given pids (and their process groups): SIGTERM, wait, SIGKILL.
terminate() {
    local pids=("$@") pid waited=0
    for pid in "${pids[@]}"; do
        kill -CONT "$pid" 2>/dev/null || true  # a paused broker cannot handle SIGTERM
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    while (( waited < STOP_TIMEOUT * 5 )); do
        local alive=0
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then alive=1; fi
        done
        (( alive )) || return 0
        sleep 0.2
        waited=$((waited + 1))
    done
    log "broker did not exit within ${STOP_TIMEOUT}s after SIGTERM; sending SIGKILL"
    for pid in "${pids[@]}"; do
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    done
    waited=0
    while (( waited < 50 )); do
        local alive=0
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then alive=1; fi
        done
        (( alive )) || return 0
        sleep 0.2
        waited=$((waited + 1))
    done
    die "could not kill broker pid(s) ${pids[*]}"
}

# Wipes and recreates the run dir, refusing to touch a non-empty directory
# that this script did not create.
reset_run_dir() {
    local dir="$RUN_DIR"
    [[ -n "$dir" && "$dir" != "/" && "$dir" != "${HOME:-}" && "$dir" != "$SCRIPT_DIR"* ]] \
        || die "refusing to use '$dir' as the run dir"
    if [[ -d "$dir" && -n "$(ls -A "$dir")" && ! -f "$dir/$RUN_MARKER" ]]; then
        die "run dir $dir exists, is not empty and was not created by this script; remove it or set VIGIL_KAFKA_RUN"
    fi
    rm -rf "$dir"
    mkdir -p "$dir/data"
    : >"$dir/$RUN_MARKER"
}

sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

# Signs a certificate for a new key NAME.key with the dev CA: NAME, subject, extensions.
issue_cert() {
    local name=$1 subject=$2 extensions=$3
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$name.key" -out "$name.csr" -subj "$subject"
    printf '%s\n' "basicConstraints=critical,CA:FALSE" \
        "authorityKeyIdentifier=keyid,issuer" \
        "keyUsage=critical,digitalSignature" "$extensions" >"$name.ext"
    openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -days 30 -extfile "$name.ext" -out "$name.pem"
    rm -f "$name.csr" "$name.ext"
}

# The dev CA, broker and client certificates, the SASL password and security.json.
make_credentials() {
    command -v openssl >/dev/null 2>&1 \
        || die "openssl not found on PATH; it makes the dev broker's TLS certificates"
    mkdir -p "$TLS_DIR"
    chmod 700 "$TLS_DIR"
    if ! (
        cd "$TLS_DIR" &&
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout ca.key -out ca.pem -days 30 -subj "/CN=Vigil dev CA" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" &&
        issue_cert broker "/CN=localhost" \
            $'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth' &&
        issue_cert client "/CN=vigil-client" "extendedKeyUsage=clientAuth" &&
        cat broker.key broker.pem ca.pem >broker-keystore.pem
    ) >"$RUN_DIR/tls.log" 2>&1; then
        cat "$RUN_DIR/tls.log" >&2
        die "making the dev TLS certificates in $TLS_DIR failed"
    fi
    SASL_PASSWORD="$(head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24)"
    (umask 077 && printf '%s\n' "$SASL_PASSWORD" >"$SASL_PASSWORD_FILE")
    cat >"$SECURITY_JSON" <<JSON
{
  "sasl_ssl": "$HOST:$KAFKA_SASL_SSL_PORT",
  "ssl": "$HOST:$KAFKA_SSL_PORT",
  "ssl_cafile": "$TLS_DIR/ca.pem",
  "ssl_certfile": "$TLS_DIR/client.pem",
  "ssl_keyfile": "$TLS_DIR/client.key",
  "sasl_username": "$SASL_USER",
  "sasl_password_file": "$SASL_PASSWORD_FILE"
}
JSON
}

write_server_properties() {
    sed -e "s|@KAFKA_PORT@|$KAFKA_PORT|g" \
        -e "s|@KAFKA_CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|g" \
        -e "s|@KAFKA_SASL_SSL_PORT@|$KAFKA_SASL_SSL_PORT|g" \
        -e "s|@KAFKA_SSL_PORT@|$KAFKA_SSL_PORT|g" \
        -e "s|@KAFKA_TLS_DIR@|$(sed_escape "$TLS_DIR")|g" \
        -e "s|@KAFKA_SASL_USER@|$SASL_USER|g" \
        -e "s|@KAFKA_SASL_PASSWORD@|$SASL_PASSWORD|g" \
        -e "s|@KAFKA_DATA_DIR@|$(sed_escape "$RUN_DIR/data")|g" \
        "$TEMPLATE" >"$SERVER_PROPERTIES"
    if grep -q '@[A-Z_]*@' "$SERVER_PROPERTIES"; then
        die "unsubstituted placeholder in $SERVER_PROPERTIES: $(grep -m1 '@[A-Z_]*@' "$SERVER_PROPERTIES")"
    fi
}

# Random KRaft cluster id: 16 random bytes, URL-safe base64 without padding
# (the format of org.apache.kafka.common.Uuid), never starting with '-'.
new_cluster_id() {
    local id
    while :; do
        id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
        if [[ ${#id} == 22 && "$id" != -* ]]; then break; fi
    done
    printf '%s\n' "$id"
}

# Exit 0 when the broker answers real Kafka requests.
broker_ready() {
    port_open "$KAFKA_PORT" || return 1
    if [[ -n "$READY_CLASSES" ]]; then
        "$JAVA" -Xshare:auto -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmx128m \
            -Dlog4j2.configurationFile="$LOG4J_CONFIG" -Dvigil.kafka.log.level=ERROR \
            -cp "$READY_CLASSES:$LIB_DIR/*" KafkaReady "$HOST:$KAFKA_PORT" 5000 \
            >>"$RUN_DIR/ready-check.log" 2>&1
    else
        grep -q 'Kafka Server started' "$BROKER_LOG" 2>/dev/null
    fi
}

# ------------------------------------------------------------ commands ----

cmd_status() {
    local pids
    pids="$(running_pids)"
    if [[ -n "$pids" ]]; then
        echo "running (pid ${pids//$'\n'/ }, $HOST:$KAFKA_PORT, run dir $RUN_DIR)"
        return 0
    fi
    echo "stopped"
    return 3
}

cmd_stop() {
    local pids
    pids="$(running_pids)"
    if [[ -z "$pids" ]]; then
        rm -f "$PID_FILE"
        log "not running ($HOST:$KAFKA_PORT, run dir $RUN_DIR)"
        return 0
    fi
    log "stopping broker (pid ${pids//$'\n'/ })"
    # shellcheck disable=SC2086
    terminate $pids
    rm -f "$PID_FILE"
    log "stopped"
}

STARTING_PID=""
abort_start() {
    local why=$1
    log "$why"
    tail_log
    if [[ -n "$STARTING_PID" ]] && kill -0 "$STARTING_PID" 2>/dev/null; then
        log "stopping the half-started broker (pid $STARTING_PID)"
        terminate "$STARTING_PID" || true
    fi
    rm -f "$PID_FILE"
    exit 1
}

cmd_start() {
    local pids
    pids="$(running_pids)"
    if [[ -n "$pids" ]]; then
        log "already running (pid ${pids//$'\n'/ }, $HOST:$KAFKA_PORT, run dir $RUN_DIR)"
        echo "already-running"
        return 0
    fi

    local t0=$SECONDS
    find_java
    local port
    for port in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_SSL_PORT" "$KAFKA_SSL_PORT"; do
        if port_open "$port"; then
            die "$HOST:$port is already in use by another process; set KAFKA_PORT / KAFKA_CONTROLLER_PORT / KAFKA_SASL_SSL_PORT / KAFKA_SSL_PORT"
        fi
    done

    prepare_cache

    reset_run_dir
    make_credentials
    write_server_properties

    local cluster_id
    cluster_id="$(new_cluster_id)"
    if ! "$JAVA" -Xshare:auto -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
            -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
            -cp "$LIB_DIR/*" kafka.tools.StorageTool format --standalone \
            -t "$cluster_id" -c "$SERVER_PROPERTIES" \
            --add-scram "SCRAM-SHA-512=[name=$SASL_USER,password=$SASL_PASSWORD]" \
            --add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]" \
            >"$RUN_DIR/format.log" 2>&1; then
        cat "$RUN_DIR/format.log" >&2
        die "formatting the KRaft storage in $RUN_DIR/data failed"
    fi

    launch_broker
    log "Apache Kafka $KAFKA_VERSION ready on $HOST:$KAFKA_PORT (controller $HOST:$KAFKA_CONTROLLER_PORT, pid $STARTING_PID, run dir $RUN_DIR) in $((SECONDS - t0))s"
    log "secured listeners: SASL_SSL $HOST:$KAFKA_SASL_SSL_PORT, mutual TLS $HOST:$KAFKA_SSL_PORT (credentials: $SECURITY_JSON)"
    # The one line on stdout (logs go to stderr): callers such as `make test` stop the
    # broker afterwards only if this call started it.
    echo "started"
}

# Starts the broker of the prepared run dir and waits until it answers requests.
launch_broker() {
    local -a jvm_opts
    read -r -a jvm_opts <<<"$KAFKA_HEAP_OPTS"
    # setsid: own session and process group, detached from the caller's
    # terminal; the shell writes its own pid, then becomes the JVM via exec.
    # shellcheck disable=SC2016
    setsid nohup bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PID_FILE" \
        "$JAVA" "${jvm_opts[@]}" \
        -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
        -cp "$LIB_DIR/*" kafka.Kafka "$SERVER_PROPERTIES" \
        </dev/null >>"$BROKER_LOG" 2>&1 &

    local waited=0
    while [[ ! -s "$PID_FILE" ]] && (( waited < 50 )); do
        sleep 0.1
        waited=$((waited + 1))
    done
    STARTING_PID="$(tr -dc '0-9' <"$PID_FILE" 2>/dev/null || true)"
    [[ -n "$STARTING_PID" ]] || abort_start "broker process did not start"
    trap 'abort_start "interrupted while waiting for the broker"' INT TERM

    local deadline=$((SECONDS + KAFKA_START_TIMEOUT))
    until broker_ready; do
        if ! kill -0 "$STARTING_PID" 2>/dev/null; then
            abort_start "broker (pid $STARTING_PID) exited during startup"
        fi
        if (( SECONDS >= deadline )); then
            abort_start "broker not ready on $HOST:$KAFKA_PORT after ${KAFKA_START_TIMEOUT}s"
        fi
        sleep 0.5
    done
    trap - INT TERM
}

# The pids of the running broker, or exit 1 naming what is missing.
require_running() {
    local pids
    pids="$(running_pids)"
    [[ -n "$pids" ]] || die "no broker running ($HOST:$KAFKA_PORT, run dir $RUN_DIR)"
    printf '%s\n' "$pids"
}

cmd_pause() {
    local pid
    for pid in $(require_running); do kill -STOP "$pid"; done
    log "paused (SIGSTOP) the broker on $HOST:$KAFKA_PORT"
}

cmd_resume() {
    local pid
    for pid in $(require_running); do kill -CONT "$pid"; done
    log "resumed (SIGCONT) the broker on $HOST:$KAFKA_PORT"
}

# Stops the broker (if running) and starts it again on the same run dir: data,
# listeners and credentials unchanged, as a broker host coming back.
cmd_restart() {
    [[ -f "$SERVER_PROPERTIES" && -f "$RUN_DIR/$RUN_MARKER" ]] \
        || die "no run dir to restart in $RUN_DIR; use start"
    cmd_stop
    local t0=$SECONDS
    find_java
    prepare_cache
    launch_broker
    log "Apache Kafka $KAFKA_VERSION restarted on $HOST:$KAFKA_PORT (pid $STARTING_PID, same data) in $((SECONDS - t0))s"
}

main() {
    [[ $# -eq 1 ]] || usage
    check_port_var KAFKA_PORT "$KAFKA_PORT"
    check_port_var KAFKA_CONTROLLER_PORT "$KAFKA_CONTROLLER_PORT"
    KAFKA_SASL_SSL_PORT="${KAFKA_SASL_SSL_PORT:-$((KAFKA_PORT + 2))}"
    KAFKA_SSL_PORT="${KAFKA_SSL_PORT:-$((KAFKA_PORT + 3))}"
    check_port_var KAFKA_SASL_SSL_PORT "$KAFKA_SASL_SSL_PORT"
    check_port_var KAFKA_SSL_PORT "$KAFKA_SSL_PORT"
    local distinct
    distinct="$(printf '%s\n' "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_SSL_PORT" "$KAFKA_SSL_PORT" | sort -u | wc -l)"
    (( distinct == 4 )) || die "KAFKA_PORT, KAFKA_CONTROLLER_PORT, KAFKA_SASL_SSL_PORT and KAFKA_SSL_PORT must differ"
    [[ "$KAFKA_START_TIMEOUT" =~ ^[0-9]+$ ]] || die "KAFKA_START_TIMEOUT must be a number of seconds"
    KAFKA_VERSION="$(kafka_version)"

    case "$1" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        pause) cmd_pause ;;
        resume) cmd_resume ;;
        restart) cmd_restart ;;
        *) usage ;;
    esac
}

main "$@"
