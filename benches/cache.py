#!/usr/bin/env python3
"""The near cache end to end (issue 29): GET of a hot set of keys through Tollgate with the cache
on, beside Redis directly, twemproxy and Tollgate with the cache off, in one run.

A thousand keys (`key:000000000000` … `key:000000000999`, 100-byte values) are written first;
redis-benchmark then reads them at random (`-t get -r 1000`, 50 clients), unpipelined and with
`-P 16`, several rounds interleaved across the four targets, all on Unix sockets in front of the
same redis-server. Reported: requests/s (median of the rounds, p50 / p99), ratios, and the CPU
the proxy and redis-server each spent per request (/proc, per redis-benchmark run) — with the
cache on, Redis's share of a GET should be near zero once the hot set is in.

    python3 benches/cache.py [--requests N] [--rounds R] [--no-build] [--pin] [--binary PATH]

--pin, as in e2e.py: redis-server and the proxies on the last CPU, redis-benchmark on the others.

Not measured here: Redis behind a network hop. The issue asks for `tc netem` or a delaying relay;
this machine's kernel has no netem qdisc, and a relay in a scripting language would cost more CPU
than what it delays.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the same servers, sockets, ACL set-up and CPU accounting)

HOT_KEYS = 1000
VALUE = "v" * 100


def fill(redis_sock):
    """Writes the hot set straight to Redis, as redis-benchmark names its random keys."""
    commands = "".join(f"SET key:{index:012d} {VALUE}\n" for index in range(HOT_KEYS))
    subprocess.run(["redis-cli", "-s", redis_sock], input=commands, check=True, capture_output=True, text=True)


def get_rows(sock, pipeline, requests, client_cpus, watch):
    """One redis-benchmark GET run over the hot set: (rps, p50, p99, {who: µs per request})."""
    taskset = ["taskset", "-c", client_cpus] if client_cpus else []
    before = {name: e2e.cpu_ns(pid) for name, pid in watch}
    out = subprocess.run(
        taskset + ["redis-benchmark", "-s", sock, "-c", "50", "-n", str(requests), "-P", str(pipeline),
                   "-r", str(HOT_KEYS), "-t", "get", "--csv"],
        capture_output=True, text=True, check=True,
    ).stdout
    cpu = {name: (e2e.cpu_ns(pid) - before[name]) / 1000 / requests for name, pid in watch}
    rows = [line.replace('"', "").split(",") for line in out.strip().splitlines()[1:]]
    (_, rps, _avg, _min, p50, _p95, p99, _max) = rows[0]
    return float(rps), float(p50), float(p99), cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-build", action="store_true", help="use target/release/tollgate as it is")
    parser.add_argument("--binary", default=os.path.join(e2e.ROOT, "target", "release", "tollgate"))
    parser.add_argument("--pin", action="store_true",
                        help="servers on the last CPU, redis-benchmark on the others")
    args = parser.parse_args()
    server_cpus, client_cpus = e2e.cpu_split() if args.pin else (None, None)
    for tool in ("redis-server", "redis-benchmark", "redis-cli", "nutcracker"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: run scripts/setup.sh")
    e2e.raise_nofile()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "tollgate"], cwd=e2e.ROOT, check=True)
    binary = os.path.abspath(args.binary)

    work = tempfile.mkdtemp(prefix="tollgate-cache-bench-")
    procs = []
    try:
        redis_sock = os.path.join(work, "redis.sock")
        redis = subprocess.Popen(e2e.redis_argv(work, redis_sock))
        procs.append(redis)
        e2e.wait_for_socket(redis_sock)
        fill(redis_sock)

        nut_argv, nut_sock = e2e.nutcracker_argv(work, redis_sock)
        nutcracker = subprocess.Popen(nut_argv, preexec_fn=e2e.raise_nofile)
        procs.append(nutcracker)
        e2e.wait_for_socket(nut_sock)

        lanes_yaml = e2e.provision_lanes(binary, redis_sock, work)
        daemons = {}
        for name, cache in (("tollgate", False), ("cached", True)):
            config, sock = e2e.tollgate_config(work, name, redis_sock, lanes_yaml)
            if cache:
                with open(config, "a") as conf:
                    conf.write('cache:\n  keys: ["key:*"]\n')
            proc = subprocess.Popen([binary, "serve", "--config", config], preexec_fn=e2e.raise_nofile)
            procs.append(proc)
            e2e.wait_for_socket(sock)
            daemons[name] = (proc, sock)

        targets = [("redis", redis_sock, [("redis", redis.pid)]),
                   ("twemproxy", nut_sock, [("redis", redis.pid), ("proxy", nutcracker.pid)])]
        targets += [(name, sock, [("redis", redis.pid), ("proxy", proc.pid)])
                    for name, (proc, sock) in daemons.items()]
        if args.pin:
            for proc in procs:
                e2e.pin(proc.pid, server_cpus)
        load_before = os.getloadavg()
        results = {}
        for round_no in range(args.rounds):
            for pipeline in (1, 16):
                for name, sock, watch in targets:
                    results.setdefault((name, pipeline), []).append(
                        get_rows(sock, pipeline, args.requests, client_cpus, watch))
            print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)
        load_after = os.getloadavg()

        names = [name for name, _, _ in targets]
        ratios = [("cached", "redis"), ("cached", "twemproxy"), ("cached", "tollgate"), ("tollgate", "twemproxy")]
        pin_flag = " --pin" if args.pin else ""
        print(f"Command: `python3 benches/cache.py --requests {args.requests} --rounds {args.rounds}{pin_flag}` "
              f"(redis-benchmark -c 50 -n {args.requests} -t get -r {HOT_KEYS}, {HOT_KEYS} keys of "
              f"{len(VALUE)} bytes, Unix sockets, median of {args.rounds} interleaved rounds; `cached` is "
              f"Tollgate with `cache.keys: [\"key:*\"]`; load average {load_before[0]:.2f} at the start, "
              f"{load_after[0]:.2f} at the end)")
        print()
        print("| GET | " + " | ".join(names) + " | " + " | ".join(f"{a}/{b}" for a, b in ratios) + " |")
        print("|---|" + "---|" * (len(names) + len(ratios)))
        for pipeline in (1, 16):
            med = {}
            cells = []
            for name in names:
                rows = results[(name, pipeline)]
                med[name] = statistics.median(r[0] for r in rows)
                p50 = statistics.median(r[1] for r in rows)
                p99 = statistics.median(r[2] for r in rows)
                cells.append(f"{med[name]:,.0f} ({p50:.3f} / {p99:.3f})")
            label = "unpipelined" if pipeline == 1 else "-P 16"
            print(f"| {label} | " + " | ".join(cells) + " | "
                  + " | ".join(f"{med[a] / med[b]:.2f}" for a, b in ratios) + " |")
        print()
        print("CPU per request, µs (median of the rounds): the proxy's, and redis-server's behind it")
        print()
        proxies = [name for name in names if name != "redis"]
        print("| GET | " + " | ".join(f"{n} proxy" for n in proxies) + " | "
              + " | ".join(f"redis via {n}" for n in names) + " |")
        print("|---|" + "---|" * (len(proxies) + len(names)))
        for pipeline in (1, 16):
            def cpu(name, who):
                return statistics.median(r[3][who] for r in results[(name, pipeline)])
            label = "unpipelined" if pipeline == 1 else "-P 16"
            print(f"| {label} | " + " | ".join(f"{cpu(n, 'proxy'):.2f}" for n in proxies) + " | "
                  + " | ".join(f"{cpu(n, 'redis'):.2f}" for n in names) + " |")
    finally:
        e2e.stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
