#!/usr/bin/env bash
# A local Redis Cluster to try Tollgate on: 3 masters and 3 replicas on loopback ports
# $PORT+1 .. $PORT+6 (default 30001-30006), data and logs in [dir] (default ./tollgate-cluster).
#
#   scripts/cluster.sh start [dir]   start the nodes, form the cluster, provision Tollgate's ACL users
#                                    on every node and write [dir]/tollgate.yaml (printed too)
#   scripts/cluster.sh stop [dir]    stop the nodes started in [dir]
#
# The users come from `tollgate redis-acl` (passwords in [dir]/acl), with the binary at $TOLLGATE,
# else target/release/tollgate, else target/debug/tollgate; without one, start says how to do it.
# ACL users are per node (a cluster does not replicate them), so every node gets them, replicas
# too: a replica promoted by a failover must accept the daemon's lanes.
#
# Every node starts with Redis's `default` user off: an open `default` would let any local user
# delete another's lease or reset a fence counter (docs/cluster.md). The nodes' administrator is
# `tollgate-root`, its password in [dir]/acl/admin.password (the one `tollgate redis-acl` uses too);
# replicas replicate as it. Its users and password reach redis-server on standard input and
# redis-cli through REDISCLI_AUTH, never a command line other local users can read.
#   REDISCLI_AUTH=$(cat [dir]/acl/admin.password) redis-cli -p 30001 --user tollgate-root
set -euo pipefail

command=${1:-}
dir=${2:-./tollgate-cluster}
base=${PORT:-30000}
ports=$(seq $((base + 1)) $((base + 6)))

case "$command" in
start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    (umask 077 && mkdir -p "$dir/acl")
    if [[ ! -s $dir/acl/admin.password ]]; then
        (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$dir/acl/admin.password")
    fi
    admin_password=$(head -n1 "$dir/acl/admin.password")
    export REDISCLI_AUTH=$admin_password
    cli() { redis-cli --user tollgate-root "$@"; }
    for port in $ports; do
        # A small node timeout makes failovers quick; nothing is persisted. `-`: the users come
        # on standard input.
        printf 'user default off\nuser tollgate-root on >%s ~* &* +@all\nmasteruser tollgate-root\nmasterauth %s\n' \
            "$admin_password" "$admin_password" |
        redis-server - --port "$port" --bind 127.0.0.1 --daemonize yes \
            --cluster-enabled yes --cluster-node-timeout 1000 \
            --cluster-config-file "nodes-$port.conf" \
            --appendonly no --save "" --dir "$dir" --dbfilename "dump-$port.rdb" \
            --pidfile "$dir/redis-$port.pid" --logfile "$dir/redis-$port.log"
    done
    for port in $ports; do
        until cli -p "$port" ping 2>/dev/null | grep -q PONG; do sleep 0.1; done
    done
    addresses=()
    for port in $ports; do addresses+=("127.0.0.1:$port"); done
    cli --cluster create "${addresses[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log"
    # `create` returns once the nodes agree on the slots; wait for every node to serve them.
    for port in $ports; do
        until cli -p "$port" cluster info | grep -q '^cluster_state:ok'; do sleep 0.1; done
    done
    list=$(printf "'%s', " "${addresses[@]}")
    # tollgate-root can reach every key, so the daemon accepts it only by name.
    redis_yaml="redis: { cluster: { addresses: [${list%, }] }, trusted_users: [tollgate-root] }"
    root=$(cd "$(dirname "$0")/.." && pwd)
    tollgate=${TOLLGATE:-}
    for candidate in "$root/target/release/tollgate" "$root/target/debug/tollgate"; do
        if [[ -z $tollgate && -x $candidate ]]; then tollgate=$candidate; fi
    done
    if [[ -n $tollgate && ! -x $tollgate ]]; then
        echo "\$TOLLGATE=$tollgate is not an executable" >&2
        exit 1
    fi
    echo "cluster up (logs in $dir)"
    if [[ -z $tollgate ]]; then
        echo "no tollgate binary (\$TOLLGATE, target/release/tollgate, target/debug/tollgate): the lanes'"
        echo "users are not provisioned. With one, on every node:"
        echo "  tollgate redis-acl --passwords $dir/acl | REDISCLI_AUTH=\$(cat $dir/acl/admin.password) redis-cli --user tollgate-root -p PORT    # for each of $(echo $ports)"
        echo "and in tollgate.yaml, beside the line below, the output of"
        echo "  tollgate redis-acl --passwords $dir/acl --lanes-yaml"
        echo "$redis_yaml"
        exit 0
    fi
    # Its explanation (why `default` goes off) is for a person running it by hand.
    acl=$("$tollgate" redis-acl --passwords "$dir/acl" 2>/dev/null)
    for port in $ports; do
        # redis-cli exits 0 on an error reply: look for one.
        out=$(cli -p "$port" <<<"$acl")
        if grep -q '^ERR\|^(error)' <<<"$out"; then
            echo "provisioning node $port failed: $out" >&2
            exit 1
        fi
    done
    {
        echo "runtime_dir: $dir/run"
        echo "$redis_yaml"
        "$tollgate" redis-acl --passwords "$dir/acl" --lanes-yaml
    } >"$dir/tollgate.yaml"
    echo "lane users provisioned on every node ($tollgate redis-acl, passwords in $dir/acl);"
    echo "$dir/tollgate.yaml (the RESP socket is $dir/run/resp.sock):"
    echo
    cat "$dir/tollgate.yaml"
    echo
    echo "run: $tollgate serve --config $dir/tollgate.yaml"
    ;;
stop)
    for port in $ports; do
        pidfile="$dir/redis-$port.pid"
        if [[ -f $pidfile ]]; then
            # SIGTERM by pid: no password needed, unlike SHUTDOWN.
            kill "$(cat "$pidfile")" 2>/dev/null || true
            rm -f "$pidfile" "$dir/nodes-$port.conf"
        fi
    done
    rm -f "$dir/tollgate.yaml"
    echo "cluster in $dir stopped"
    ;;
*)
    echo "usage: $0 start|stop [dir]" >&2
    exit 2
    ;;
esac
