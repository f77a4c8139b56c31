#!/usr/bin/env bash
# A multi-node Ray cluster on ONE machine, for testing raysim's cluster code paths
# (several nodes, placement across nodes, fractional GPUs) without a real cluster.
#
#   cluster/local_cluster.sh up [N]   head + N worker nodes (default 2)
#   cluster/local_cluster.sh status   ray status of this cluster
#   cluster/local_cluster.sh down     ends the processes of THIS cluster (and no other Ray)
#
# Every node is a separate `ray start` (its own raylet, object store and resources), as
# ray.cluster_utils.Cluster does inside one Python process: the nodes share the host, so each
# worker node gets its own dashboard-agent port, grpc ports are picked at random, worker
# processes get random ports and only the head runs a log monitor.
#
# Stopping only this cluster: `ray stop` ends every Ray process on the machine, so it is not used.
# Instead `up` runs each `ray start` in a new session (setsid) and records the session id in
# RAY_TEMP_DIR/nodes.sid. The daemons `ray start` leaves behind (GCS, raylet, dashboard, agents,
# ...) and the worker processes a raylet forks later stay in that session (they change their
# process group, not their session), so `down` sends SIGTERM to the processes in the recorded
# sessions, SIGKILL to what is left after DOWN_GRACE_S seconds, and removes the record. A session
# is only acted on while one of its processes names RAY_TEMP_DIR on its command line (the GCS and
# raylets do), so a stale record whose id now belongs to someone else's session stops nothing.
# `down` must be given the RAY_TEMP_DIR that `up` was given.
#
# Network: every node is started with --node-ip-address 127.0.0.1 and the dashboard / job server
# listens on 127.0.0.1 only. On Linux, however, Ray replaces a loopback --node-ip-address with the
# machine's own address and its GCS, raylets and agents listen on all interfaces; so the cluster
# uses token authentication (below), and on an untrusted network a firewall should close the
# ports it opens. Clients can still use 127.0.0.1:RAY_PORT.
#
# GPUs are logical: --num-gpus declares them whether or not the machine has any, so
# runtime.gpus_per_actor=0.25 places four ClientActors per logical GPU (they train on the CPU
# when there is no CUDA).
#
# Settings (environment variables):
#   RAY_PORT          GCS port of the head                      (6379)
#   DASHBOARD_PORT    dashboard and job server port             (8265)
#   CLIENT_PORT       Ray Client server port (ray://)           (10001)
#   AGENT_PORT_BASE   dashboard-agent port of the head; worker i uses AGENT_PORT_BASE + i (52365)
#   NODE_CPUS         logical CPUs per node                     (2)
#   NODE_GPUS         logical GPUs per node                     (2)
#   HEAD_CPUS         logical CPUs of the head                  (NODE_CPUS)
#   HEAD_GPUS         logical GPUs of the head                  (0: the head only runs the driver)
#   OBJECT_STORE_MB   object store per node, MiB                (256)
#   RAY_TEMP_DIR      Ray's temp/log directory for these nodes  (/tmp/raysim-cluster)
#   DOWN_GRACE_S      seconds `down` waits after SIGTERM before SIGKILL (10)
#
# RAY_TEMP_DIR is kept apart from Ray's default /tmp/ray on purpose: a `ray start` writes its
# address to <temp dir>/ray_current_cluster, and a plain ray.init() on this machine (an embedded
# raysim run, the test suite) would otherwise join this cluster instead of starting its own.
# Consequently runtime.address=auto does not find this cluster: pass the printed address.

set -euo pipefail

HOST=127.0.0.1
RAY_PORT=${RAY_PORT:-6379}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
CLIENT_PORT=${CLIENT_PORT:-10001}
AGENT_PORT_BASE=${AGENT_PORT_BASE:-52365}
NODE_CPUS=${NODE_CPUS:-2}
NODE_GPUS=${NODE_GPUS:-2}
HEAD_CPUS=${HEAD_CPUS:-$NODE_CPUS}
HEAD_GPUS=${HEAD_GPUS:-0}
OBJECT_STORE_MB=${OBJECT_STORE_MB:-256}
RAY_TEMP_DIR=$(realpath -ms -- "${RAY_TEMP_DIR:-/tmp/raysim-cluster}")  # absolute, as Ray names it
DOWN_GRACE_S=${DOWN_GRACE_S:-10}
SID_FILE=$RAY_TEMP_DIR/nodes.sid

usage() {
    echo "usage: $0 up [N] | down | status" >&2
    exit 2
}

require_ray() {
    if ! command -v ray >/dev/null 2>&1; then
        echo "ray is not on PATH (pip install -e . installs it)" >&2
        exit 1
    fi
}

# Token authentication (Ray releases that have `ray get-auth-token`): `ray start --head` turns it
# on by itself when ~/.ray/auth_token exists (any earlier ray.init() on this machine creates
# one), but worker nodes and clients given an explicit address only use it when RAY_AUTH_MODE
# says so. Set it for every node here; clients need the same export (printed by `up`).
# RAY_AUTH_MODE=disabled in the environment turns authentication off instead.
setup_auth() {
    if [[ ${RAY_AUTH_MODE:-token} == token ]] && ray get-auth-token --help >/dev/null 2>&1; then
        export RAY_AUTH_MODE=token
        ray get-auth-token --generate >/dev/null  # creates ~/.ray/auth_token if missing
    fi
}

# Options every node gets: loopback only, its own resources, random ports where nodes could clash.
common_opts() {
    local cpus=$1 gpus=$2
    printf '%s\n' \
        --node-ip-address "$HOST" \
        --num-cpus "$cpus" \
        --num-gpus "$gpus" \
        --object-store-memory "$((OBJECT_STORE_MB * 1024 * 1024))" \
        --min-worker-port 0 \
        --max-worker-port 0 \
        --temp-dir "$RAY_TEMP_DIR" \
        --disable-usage-stats
}

# Runs "$@" (a `ray start ...`) in a new session and appends that session's id and NAME to
# SID_FILE before it starts: after setsid() the shell's own PID is the session id.
start_node() {
    local name=$1
    shift
    # shellcheck disable=SC2016  # $$ and $1 are the inner shell's, expanded there
    setsid --wait bash -c 'echo "$$ $1" >>"$2"; shift 2; exec "$@"' bash "$name" "$SID_FILE" "$@"
}

# Session ids recorded in SID_FILE (one per line), if any.
recorded_sids() {
    [[ -f $SID_FILE ]] || return 0
    awk '$1 ~ /^[0-9]+$/ {print $1}' "$SID_FILE"
}

# PIDs of the live (non-zombie) processes in session $1.
session_pids() {
    ps -e -o pid=,sid=,stat= | awk -v sid="$1" '$2 == sid && $3 !~ /^Z/ {print $1}'
}

# PIDs of the live processes in the sessions given as arguments.
sessions_pids() {
    local sid
    for sid in "$@"; do
        session_pids "$sid"
    done
}

# Whether session $1 holds a process whose command line names RAY_TEMP_DIR (one of this
# cluster's GCS / raylets), i.e. the session is still this cluster's and not a reused id.
session_is_ours() {
    local pid
    for pid in $(session_pids "$1"); do
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$RAY_TEMP_DIR/session_"; then
            return 0
        fi
    done
    return 1
}

cmd_up() {
    local workers=${1:-2}
    if ! [[ $workers =~ ^[0-9]+$ ]]; then
        echo "N must be a whole number of worker nodes, got '$workers'" >&2
        exit 2
    fi
    require_ray
    command -v setsid >/dev/null 2>&1 || { echo "setsid (util-linux) is not on PATH" >&2; exit 1; }
    local sid
    for sid in $(recorded_sids); do
        if [[ -n $(session_pids "$sid") ]]; then
            echo "a cluster recorded in $SID_FILE is still running: run '$0 down' first" >&2
            exit 1
        fi
    done
    setup_auth
    mkdir -p "$RAY_TEMP_DIR"
    rm -f "$SID_FILE"

    local -a opts
    mapfile -t opts < <(common_opts "$HEAD_CPUS" "$HEAD_GPUS")
    echo "starting head: $HEAD_CPUS CPUs, $HEAD_GPUS GPUs, $HOST:$RAY_PORT"
    start_node head ray start --head "${opts[@]}" \
        --port "$RAY_PORT" \
        --dashboard-host "$HOST" \
        --dashboard-port "$DASHBOARD_PORT" \
        --ray-client-server-port "$CLIENT_PORT" \
        --dashboard-agent-listen-port "$AGENT_PORT_BASE" >/dev/null

    local i
    mapfile -t opts < <(common_opts "$NODE_CPUS" "$NODE_GPUS")
    for ((i = 1; i <= workers; i++)); do
        echo "starting worker $i/$workers: $NODE_CPUS CPUs, $NODE_GPUS GPUs"
        start_node "worker$i" ray start "${opts[@]}" \
            --address "$HOST:$RAY_PORT" \
            --node-manager-port 0 \
            --object-manager-port 0 \
            --dashboard-agent-listen-port "$((AGENT_PORT_BASE + i))" \
            --include-log-monitor false >/dev/null
    done

    echo
    echo "Ray cluster up: 1 head + $workers worker node(s) on $HOST"
    if [[ ${RAY_AUTH_MODE:-} == token ]]; then
        echo "  token authentication is on: run 'export RAY_AUTH_MODE=token' in the shell that runs raysim or ray job"
    fi
    echo "  raysim:     raysim run scenarios/quickstart.yaml runtime.address=$HOST:$RAY_PORT"
    echo "  override:   runtime.address=$HOST:$RAY_PORT"
    echo "  job server: http://$HOST:$DASHBOARD_PORT   (ray job submit --address http://$HOST:$DASHBOARD_PORT ...)"
    echo "  status:     $0 status      stop: $0 down"
}

cmd_status() {
    require_ray
    setup_auth
    ray status --address "$HOST:$RAY_PORT"
}

cmd_down() {
    if [[ ! -f $SID_FILE ]]; then
        echo "no cluster recorded in $SID_FILE: nothing to stop (other Ray processes are left alone)"
        return 0
    fi
    local -a sids=() pids=()
    local sid
    for sid in $(recorded_sids); do
        if session_is_ours "$sid"; then
            sids+=("$sid")
        elif [[ -n $(session_pids "$sid") ]]; then
            echo "session $sid runs no node of $RAY_TEMP_DIR any more: left alone" >&2
        fi
    done

    mapfile -t pids < <(sessions_pids "${sids[@]}")
    if ((${#pids[@]} > 0)); then
        echo "stopping ${#pids[@]} process(es) in session(s) ${sids[*]}"
        kill -TERM "${pids[@]}" 2>/dev/null || true
        local waited=0
        while ((waited < DOWN_GRACE_S)); do
            sleep 1
            waited=$((waited + 1))
            mapfile -t pids < <(sessions_pids "${sids[@]}")
            ((${#pids[@]} > 0)) || break
        done
        if ((${#pids[@]} > 0)); then
            echo "SIGKILL to ${#pids[@]} process(es) still running after ${DOWN_GRACE_S}s"
            kill -KILL "${pids[@]}" 2>/dev/null || true
            sleep 1
            mapfile -t pids < <(sessions_pids "${sids[@]}")
        fi
    fi
    if ((${#pids[@]} > 0)); then
        echo "still running: ${pids[*]}" >&2
        exit 1
    fi
    rm -f "$SID_FILE" "$RAY_TEMP_DIR/ray_current_cluster"  # the address file, as ray stop does
    echo "Ray cluster of $RAY_TEMP_DIR is down"
}

case "${1:-}" in
    up)
        [[ $# -le 2 ]] || usage
        cmd_up "${2:-2}"
        ;;
    down)
        [[ $# -eq 1 ]] || usage
        cmd_down
        ;;
    status)
        [[ $# -eq 1 ]] || usage
        cmd_status
        ;;
    *)
        usage
        ;;
esac
