#!/usr/bin/env python3
"""Two Tollgate builds side by side: the same redis-server, pinned as `e2e.py --pin` pins them,
each redis-benchmark run alone against one build, the order alternated every round; medians of
the rounds of throughput and of each build's CPU per request (from /proc), with every run's CPU.

For a request-path change whose `e2e.py --baseline` rows moved by less than a slow run does:
three interleaved rounds catch a build in this machine's slow regime (one run in a few, either
build) often enough to move a median; more rounds of fewer targets tell the regime from the
change.

    python3 benches/ab.py NEW_BINARY OLD_BINARY [--tests get,incr,lpush] [--rounds 8]
                                                  [--pipeline 1] [--requests 100000] [--cache]
                                                  [--no-pin]

--cache: both builds with the near cache on (`cache.keys: ["key:*"]`) and the hot set of
`benches/cache.py` written first (1,000 keys of 100 bytes); redis-benchmark then reads it at random
(`-r 1000`), so after the first round every GET is a hit: the hit path, A/B.

--no-pin: nothing pinned; redis-server then runs on whichever core is free and reads each write as
it lands, where pinned it waits for the proxy to yield its core (how a lane's batching plays out
depends on which).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the same redis-server, lane users, configs and benchmark runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new")
    parser.add_argument("old")
    parser.add_argument("--tests", default="get,incr,lpush")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--pipeline", type=int, default=1)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--no-pin", action="store_true", help="pin nothing (the default pins as e2e.py --pin)")
    parser.add_argument("--cache", action="store_true")
    args = parser.parse_args()
    e2e.raise_nofile()
    e2e.TESTS = args.tests
    work = tempfile.mkdtemp(prefix="tollgate-ab-")
    procs = []
    try:
        redis_sock = os.path.join(work, "redis.sock")
        procs.append(subprocess.Popen(e2e.redis_argv(work, redis_sock)))
        e2e.wait_for_socket(redis_sock)
        redis_pid = procs[0].pid
        if args.cache:
            import cache  # noqa: E402  (the hot set)
            cache.fill(redis_sock)
            e2e.RANDOM_KEYS = cache.HOT_KEYS
        lanes = e2e.provision_lanes(args.new, redis_sock, work)
        builds = {}
        # The new build as e2e's `tollgate`, the old one as its `baseline` (older configs).
        for name, binary in (("new", args.new), ("old", args.old)):
            slot = "tollgate" if name == "new" else "baseline"
            config, sock = e2e.tollgate_config(work, slot, redis_sock, lanes,
                                               None if name == "new" else binary)
            if args.cache:
                with open(config, "a") as conf:
                    conf.write('cache:\n  keys: ["key:*"]\n')
            proc = subprocess.Popen([binary, "serve", "--config", config],
                                    stderr=subprocess.DEVNULL, preexec_fn=e2e.raise_nofile)
            procs.append(proc)
            e2e.wait_for_socket(sock)
            builds[name] = (sock, proc.pid)
        servers, clients = (None, None) if args.no_pin else e2e.cpu_split()
        for proc in procs if servers else ():
            e2e.pin(proc.pid, servers)
        runs = {}  # (build, test) -> [(rps, proxy µs, redis µs)]
        for round_no in range(args.rounds):
            order = ["new", "old"] if round_no % 2 == 0 else ["old", "new"]
            for name in order:
                sock, pid = builds[name]
                watch = [("proxy", pid), ("redis", redis_pid)]
                rows = e2e.benchmark(sock, args.pipeline, args.requests, clients, watch)
                for test, (rps, _p50, _p99, cpu) in rows.items():
                    runs.setdefault((name, test), []).append((rps, cpu["proxy"], cpu["redis"]))
        load = os.getloadavg()[0]
        cached = ", near cache on, hot set of 1,000 keys" if args.cache else ""
        pinned = ", unpinned" if args.no_pin else ""
        print(f"{args.rounds} rounds, -P {args.pipeline}, {args.requests} requests a run{cached}{pinned}, "
              f"load average {load:.2f} at the end")
        print("| build | test | req/s | daemon µs/req | redis µs/req | every run's daemon µs |")
        print("|---|---|---|---|---|---|")
        for (name, test), values in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
            rps = statistics.median(v[0] for v in values)
            proxy = statistics.median(v[1] for v in values)
            redis = statistics.median(v[2] for v in values)
            every = ", ".join(f"{v[1]:.2f}" for v in values)
            print(f"| {name} | {test} | {rps:,.0f} | {proxy:.2f} | {redis:.2f} | {every} |")
    finally:
        e2e.stop_all(procs)


if __name__ == "__main__":
    main()
