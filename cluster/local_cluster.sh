#!/usr/bin/env bash
# A multi-node Ray cluster on ONE machine, for testing raysim's cluster code paths
# (several nodes, placement across nodes, fractional GPUs) without a real cluster.
#
#   cluster/local_cluster.sh up [N]   head + N worker nodes (default 2)
#   cluster/local_cluster.sh status   ray status of this cluster
#   cluster/local_cluster.sh down     ray stop --force (stops EVERY Ray process on this machine)
#
# Every node is a separate `ray start` (its own raylet, object store and resources), as
# ray.cluster_utils.Cluster does inside one Python process: the nodes share the host, so each
# worker node gets its own dashboard-agent port, grpc ports are picked at random, worker
# processes get random ports and only the head runs a log monitor.
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
RAY_TEMP_DIR=${RAY_TEMP_DIR:-/tmp/raysim-cluster}

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

cmd_up() {
    local workers=${1:-2}
    if ! [[ $workers =~ ^[0-9]+$ ]]; then
        echo "N must be a whole number of worker nodes, got '$workers'" >&2
        exit 2
    fi
    require_ray
    setup_auth
    mkdir -p "$RAY_TEMP_DIR"

    local -a opts
    mapfile -t opts < <(common_opts "$HEAD_CPUS" "$HEAD_GPUS")
    echo "starting head: $HEAD_CPUS CPUs, $HEAD_GPUS GPUs, $HOST:$RAY_PORT"
    ray start --head "${opts[@]}" \
        --port "$RAY_PORT" \
        --dashboard-host "$HOST" \
        --dashboard-port "$DASHBOARD_PORT" \
        --ray-client-server-port "$CLIENT_PORT" \
        --dashboard-agent-listen-port "$AGENT_PORT_BASE" >/dev/null

    local i
    mapfile -t opts < <(common_opts "$NODE_CPUS" "$NODE_GPUS")
    for ((i = 1; i <= workers; i++)); do
        echo "starting worker $i/$workers: $NODE_CPUS CPUs, $NODE_GPUS GPUs"
        ray start "${opts[@]}" \
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
    require_ray
    # ray stop has no per-cluster filter: this ends every Ray process on the machine.
    ray stop --force
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
