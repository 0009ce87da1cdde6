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
                             [--hop-us N] [--baseline OLD]

--baseline OLD adds an older build, cache off, as one more target (`baseline`): issue 29 measures a
cached GET against the Tollgate of the day it was filed (4fd3961's build), in the same rounds.

--pin, as in e2e.py: redis-server and the proxies (and the relay, below) on the last CPU,
redis-benchmark on the others.

--hop-us N puts Redis behind a simulated network hop, as issue 29 asks: `tools/delay-relay`
(built with `cargo build --release -p delay-relay` unless --no-build) listens in front of
redis-server and writes every chunk N µs after it read it, each way (N = 250: 0.5 ms more per round
trip, as `tc netem delay 0.5ms` on one side of a veth pair — this machine's kernel has no netem
qdisc, and a relay in a scripting language would cost more CPU than it delays). Every target's
serving path crosses it: `redis` is redis-benchmark straight to the relay (a direct GET over the
hop), twemproxy's server and Tollgate's `redis.address` are the relay's socket. Only the set-up
(the hot set, the lane users' ACLs) goes straight to redis-server. Reported besides: the relay's
CPU per request, how late it wrote chunks (its own histogram, per run), and a line setting the p50
of a cached GET against that of a direct GET over the hop.
"""

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the same servers, sockets, ACL set-up and CPU accounting)

HOT_KEYS = 1000
VALUE = "v" * 100


def fill(redis_sock):
    """Writes the hot set straight to Redis, as redis-benchmark names its random keys."""
    commands = "".join(f"SET key:{index:012d} {VALUE}\n" for index in range(HOT_KEYS))
    subprocess.run(["redis-cli", "-s", redis_sock], input=commands, check=True, capture_output=True, text=True)


class Hop:
    """The delaying relay in front of redis-server (`tools/delay-relay`), and its lateness counts."""

    def __init__(self, relay_bin, work, redis_sock, hop_us):
        self.sock = os.path.join(work, "hop.sock")
        self.stats = os.path.join(work, "hop-stats")
        self.proc = subprocess.Popen([relay_bin, "--listen", self.sock, "--upstream", redis_sock,
                                      "--delay-us", str(hop_us), "--stats", self.stats])

    def late_us(self):
        """The relay's histogram so far: chunks by how many µs after their due time it wrote them."""
        self.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.05)
        with open(self.stats) as stats:
            return [int(count) for count in stats.read().split()[1:]]


def percentile(histogram, fraction):
    """The bucket (µs) under which `fraction` of the histogram's counts lie."""
    total, seen = sum(histogram), 0
    for bucket, count in enumerate(histogram):
        seen += count
        if total and seen >= fraction * total:
            return bucket
    return float("nan")


def get_rows(sock, pipeline, requests, client_cpus, watch, hop=None):
    """One redis-benchmark GET run over the hot set: (rps, p50, p99, {who: µs per request},
    the relay's lateness histogram over the run or None)."""
    taskset = ["taskset", "-c", client_cpus] if client_cpus else []
    late_before = hop.late_us() if hop else None
    before = {name: e2e.cpu_ns(pid) for name, pid in watch}
    usage, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    out = subprocess.run(
        taskset + ["redis-benchmark", "-s", sock, "-c", "50", "-n", str(requests), "-P", str(pipeline),
                   "-r", str(HOT_KEYS), "-t", "get", "--csv"],
        capture_output=True, text=True, check=True,
    ).stdout
    cpu = {name: (e2e.cpu_ns(pid) - before[name]) / 1000 / requests for name, pid in watch}
    cpu["client"] = e2e.client_busy(usage, started)
    late = [after - before for after, before in zip(hop.late_us(), late_before)] if hop else None
    rows = [line.replace('"', "").split(",") for line in out.strip().splitlines()[1:]]
    (_, rps, _avg, _min, p50, _p95, p99, _max) = rows[0]
    return float(rps), float(p50), float(p99), cpu, late


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-build", action="store_true", help="use target/release/tollgate as it is")
    parser.add_argument("--binary", default=os.path.join(e2e.ROOT, "target", "release", "tollgate"))
    parser.add_argument("--pin", action="store_true",
                        help="servers on the last CPU, redis-benchmark on the others")
    parser.add_argument("--baseline", metavar="OLD",
                        help="one more target: an older Tollgate build, cache off (`baseline`)")
    parser.add_argument("--hop-us", type=int, metavar="N",
                        help="Redis behind tools/delay-relay, N µs each way (a round trip: 2N)")
    args = parser.parse_args()
    server_cpus, client_cpus = e2e.cpu_split() if args.pin else (None, None)
    for tool in ("redis-server", "redis-benchmark", "redis-cli", "nutcracker"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: run scripts/setup.sh")
    e2e.raise_nofile()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "tollgate"], cwd=e2e.ROOT, check=True)
    binary = os.path.abspath(args.binary)
    relay_bin = os.path.join(e2e.ROOT, "target", "release", "delay-relay")
    if args.hop_us is not None:
        if not args.no_build:
            subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "delay-relay"], cwd=e2e.ROOT, check=True)
        if not os.path.exists(relay_bin):
            raise SystemExit(f"{relay_bin} not found: cargo build --release -p delay-relay")

    work = tempfile.mkdtemp(prefix="tollgate-cache-bench-")
    procs = []
    try:
        redis_sock = os.path.join(work, "redis.sock")
        redis = subprocess.Popen(e2e.redis_argv(work, redis_sock))
        procs.append(redis)
        e2e.wait_for_socket(redis_sock)
        fill(redis_sock)
        # What the targets reach Redis through: the relay, with --hop-us; else redis-server itself.
        hop = None
        serving_sock = redis_sock
        if args.hop_us is not None:
            hop = Hop(relay_bin, work, redis_sock, args.hop_us)
            procs.append(hop.proc)
            e2e.wait_for_socket(hop.sock)
            serving_sock = hop.sock

        nut_argv, nut_sock = e2e.nutcracker_argv(work, serving_sock)
        nutcracker = subprocess.Popen(nut_argv, preexec_fn=e2e.raise_nofile)
        procs.append(nutcracker)
        e2e.wait_for_socket(nut_sock)

        lanes_yaml = e2e.provision_lanes(binary, redis_sock, work)
        daemons = {}
        runs = [("tollgate", False, binary), ("cached", True, binary)]
        if args.baseline:
            runs.append(("baseline", False, os.path.abspath(args.baseline)))
        for name, cache, build in runs:
            config, sock = e2e.tollgate_config(work, name, serving_sock, lanes_yaml,
                                               None if build == binary else build)
            if cache:
                with open(config, "a") as conf:
                    conf.write('cache:\n  keys: ["key:*"]\n')
            proc = subprocess.Popen([build, "serve", "--config", config], preexec_fn=e2e.raise_nofile)
            procs.append(proc)
            e2e.wait_for_socket(sock)
            daemons[name] = (proc, sock)

        behind = [("redis", redis.pid)] + ([("relay", hop.proc.pid)] if hop else [])
        targets = [("redis", serving_sock, behind),
                   ("twemproxy", nut_sock, behind + [("proxy", nutcracker.pid)])]
        targets += [(name, sock, behind + [("proxy", proc.pid)]) for name, (proc, sock) in daemons.items()]
        if args.pin:
            for proc in procs:
                e2e.pin(proc.pid, server_cpus)
        load_before = os.getloadavg()
        results = {}
        for round_no in range(args.rounds):
            for pipeline in (1, 16):
                for name, sock, watch in targets:
                    results.setdefault((name, pipeline), []).append(
                        get_rows(sock, pipeline, args.requests, client_cpus, watch, hop))
            print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)
        load_after = os.getloadavg()

        names = [name for name, _, _ in targets]
        ratios = [("cached", "redis"), ("cached", "twemproxy"), ("cached", "tollgate"), ("tollgate", "twemproxy")]
        ratios += [("cached", "baseline"), ("tollgate", "baseline")] if args.baseline else []
        pin_flag = " --pin" if args.pin else ""
        hop_flag = f" --hop-us {args.hop_us}" if hop else ""
        hop_flag += " --baseline <older tollgate>" if args.baseline else ""
        hop_words = (f"; Redis behind tools/delay-relay, {args.hop_us} µs each way ({2 * args.hop_us / 1000:g} ms "
                     f"per round trip), crossed by every target" if hop else "")
        print(f"Command: `python3 benches/cache.py --requests {args.requests} --rounds {args.rounds}{pin_flag}"
              f"{hop_flag}` (redis-benchmark -c 50 -n {args.requests} -t get -r {HOT_KEYS}, {HOT_KEYS} keys of "
              f"{len(VALUE)} bytes, Unix sockets, median of {args.rounds} interleaved rounds; `cached` is "
              f"Tollgate with `cache.keys: [\"key:*\"]`{hop_words}; load average {load_before[0]:.2f} at the "
              f"start, {load_after[0]:.2f} at the end)")
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
        print("CPU per request, µs (median of the rounds): the proxy's, and redis-server's behind it"
              + (" (and the relay's, the simulated hop's)" if hop else ""))
        print()
        proxies = [name for name in names if name != "redis"]
        behind = ["redis"] + (["relay"] if hop else [])
        print("| GET | " + " | ".join(f"{n} proxy" for n in proxies) + " | "
              + " | ".join(f"{who} via {n}" for who in behind for n in names) + " |")
        print("|---|" + "---|" * (len(proxies) + len(behind) * len(names)))

        def cpu(name, pipeline, who):
            return statistics.median(r[3][who] for r in results[(name, pipeline)])
        for pipeline in (1, 16):
            label = "unpipelined" if pipeline == 1 else "-P 16"
            print(f"| {label} | " + " | ".join(f"{cpu(n, pipeline, 'proxy'):.2f}" for n in proxies) + " | "
                  + " | ".join(f"{cpu(n, pipeline, who):.2f}" for who in behind for n in names) + " |")
        print()
        print(e2e.client_busy_caption(client_cpus))
        print()
        print("| GET | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for pipeline in (1, 16):
            label = "unpipelined" if pipeline == 1 else "-P 16"
            print(f"| {label} | " + " | ".join(f"{cpu(n, pipeline, 'client'):.2f}" for n in names) + " |")
        if hop:
            print()
            print("How late the relay wrote chunks, µs after their due time (p50 / p99 over the rounds' "
                  "chunks), and how many chunks it carried per request:")
            print()
            print("| GET | " + " | ".join(names) + " |")
            print("|---|" + "---|" * len(names))
            for pipeline in (1, 16):
                cells = []
                for name in names:
                    rows = results[(name, pipeline)]
                    late = [sum(counts) for counts in zip(*(r[4] for r in rows))]
                    chunks = sum(late) / (len(rows) * args.requests)
                    cells.append(f"{percentile(late, 0.5)} / {percentile(late, 0.99)} ({chunks:.2f})")
                label = "unpipelined" if pipeline == 1 else "-P 16"
                print(f"| {label} | " + " | ".join(cells) + " |")
            print()
            for pipeline in (1, 16):
                def p50(name):
                    return statistics.median(r[1] for r in results[(name, pipeline)])
                label = "unpipelined" if pipeline == 1 else "-P 16"
                print(f"Over the {2 * args.hop_us / 1000:g} ms hop, {label}: p50 of a cached GET "
                      f"{p50('cached'):.3f} ms, of a direct GET {p50('redis'):.3f} ms "
                      f"({p50('cached') / p50('redis'):.2f}x; through Tollgate without the cache "
                      f"{p50('tollgate'):.3f} ms, twemproxy {p50('twemproxy'):.3f} ms).")
                print()
    finally:
        e2e.stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
