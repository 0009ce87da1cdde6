#!/usr/bin/env bash
# A local Redis Cluster to try Tollgate on: 3 masters and 3 replicas on loopback ports
# $PORT+1 .. $PORT+6 (default 30001-30006), data and logs in [dir] (default ./tollgate-cluster).
#
#   scripts/cluster.sh start [dir]   start the nodes, form the cluster, print the tollgate.yaml section
#   scripts/cluster.sh stop [dir]    stop the nodes started in [dir]
set -euo pipefail

command=${1:-}
dir=${2:-./tollgate-cluster}
base=${PORT:-30000}
ports=$(seq $((base + 1)) $((base + 6)))

case "$command" in
start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    for port in $ports; do
        # A small node timeout makes failovers quick; nothing is persisted.
        redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
            --cluster-enabled yes --cluster-node-timeout 1000 \
            --cluster-config-file "nodes-$port.conf" \
            --appendonly no --save "" --dir "$dir" --dbfilename "dump-$port.rdb" \
            --pidfile "$dir/redis-$port.pid" --logfile "$dir/redis-$port.log"
    done
    for port in $ports; do
        until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
    done
    addresses=()
    for port in $ports; do addresses+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${addresses[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log"
    # `create` returns once the nodes agree on the slots; wait for every node to serve them.
    for port in $ports; do
        until redis-cli -p "$port" cluster info | grep -q '^cluster_state:ok'; do sleep 0.1; done
    done
    list=$(printf "'%s', " "${addresses[@]}")
    echo "cluster up (logs in $dir); in tollgate.yaml:"
    echo "redis: { cluster: { addresses: [${list%, }] } }"
    ;;
stop)
    for port in $ports; do
        pidfile="$dir/redis-$port.pid"
        if [[ -f $pidfile ]]; then
            kill "$(cat "$pidfile")" 2>/dev/null || true
            rm -f "$pidfile" "$dir/nodes-$port.conf"
        fi
    done
    echo "cluster in $dir stopped"
    ;;
*)
    echo "usage: $0 start|stop [dir]" >&2
    exit 2
    ;;
esac
