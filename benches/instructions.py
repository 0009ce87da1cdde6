#!/usr/bin/env python3
"""Instructions per request, counted by callgrind: the proxies' cost in a unit that does not move
with the machine's load.

This machine's `perf stat` has no hardware counters, and wall-clock CPU per request (e2e.py's /proc
figures) swings by a microsecond between runs of the same binary on two busy cores. Callgrind counts
instructions executed, the same count for the same binary and inputs whatever else runs, so a
change of a few hundred instructions per request is visible where timing cannot see it.

Each proxy (twemproxy, Tollgate, and every --baseline build) runs under
`valgrind --tool=callgrind --instr-atstart=no` in front of one redis-server; instrumentation is
switched on after start-up, counts are zeroed, one redis-benchmark run is made per test, and the
counts are dumped. The figure is the proxy's instructions (all its threads) divided by the
requests. Redis-benchmark's own numbers under valgrind mean nothing and are not reported.

    python3 benches/instructions.py [--requests N] [--tests get,set] [--baseline OLD]... [--annotate]
                                    [--cache GLOB] [--lease]

--lease counts a lease pair instead of redis-benchmark's tests: 16 clients, each making
`LEASE ACQUIRE <own resource> 10000 OWNER … OP …` then `LEASE RELEASE …`, one call at a time
(`benches/lease`'s 16-client row); twemproxy forwards the same two scripts by EVALSHA, with the
keys and arguments the lease service would send. The figure is per call (two per pair).

--cache GLOB turns the near cache on for the keys GLOB matches (docs/cache.md) in the first
Tollgate target only: redis-benchmark's GET reads one key (`key:__rand_int__`, no -r), so with
`--cache 'key:*'` every GET after the first is a hit, and the row is the cost of one.

--annotate keeps the dumps and prints each target's top functions (callgrind_annotate), so a
difference can be followed to where it is spent.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the same provisioning and configs as the end-to-end runner)
from lease_load import LEASE_CLIENTS, lease_pairs, load_scripts  # noqa: E402


def callgrind(argv, out_prefix):
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=no",
            f"--callgrind-out-file={out_prefix}.%p"] + argv


def control(pid, *flags):
    subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)


def total_ir(path):
    with open(path) as dump:
        for line in dump:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise SystemExit(f"{path} has no totals")

def measure_lease(name, pid, sock, requests, work, shas):
    """Instructions per lease call of process `pid` (LEASE_CLIENTS clients, `requests` calls in
    all); `shas` for a forwarding proxy, None for the daemon's own LEASE."""
    control(pid, "-i", "on")
    e2e.wait_for_socket(sock, timeout=120.0)
    lease_pairs(sock, 20, shas)
    before = set(glob.glob(os.path.join(work, f"{name}.cg.{pid}*")))
    control(pid, "-z")
    pairs = max(requests // (2 * LEASE_CLIENTS), 1)
    lease_pairs(sock, pairs, shas)
    control(pid, "-d", "lease")
    time.sleep(0.2)
    dumps = sorted(set(glob.glob(os.path.join(work, f"{name}.cg.{pid}*"))) - before,
                   key=os.path.getmtime)
    if not dumps:
        raise SystemExit(f"callgrind wrote no dump for {name} lease")
    return {("lease", 1): (total_ir(dumps[-1]) / (2 * pairs * LEASE_CLIENTS), dumps[-1])}


def measure(name, pid, sock, tests, requests, work, pipelines):
    """Instructions per request of process `pid` for each (test, pipeline)."""
    control(pid, "-i", "on")
    # Warm up under instrumentation: valgrind translates each code path on its first use.
    e2e.wait_for_socket(sock, timeout=120.0)
    subprocess.run(["redis-benchmark", "-s", sock, "-c", "50", "-n", "2000", "-t", ",".join(tests),
                    "-q"], check=True, capture_output=True)
    figures = {}
    for pipeline in pipelines:
        for test in tests:
            before = set(glob.glob(os.path.join(work, f"{name}.cg.{pid}*")))
            control(pid, "-z")
            subprocess.run(["redis-benchmark", "-s", sock, "-c", "50", "-n", str(requests), "-P",
                            str(pipeline), "-t", test, "-q"], check=True, capture_output=True)
            control(pid, "-d", f"{test}-P{pipeline}")
            time.sleep(0.2)
            dumps = sorted(set(glob.glob(os.path.join(work, f"{name}.cg.{pid}*"))) - before,
                           key=os.path.getmtime)
            if not dumps:
                raise SystemExit(f"callgrind wrote no dump for {name} {test}")
            figures[(test, pipeline)] = (total_ir(dumps[-1]) / requests, dumps[-1])
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--tests", default="get,set")
    parser.add_argument("--baseline", action="append", default=[])
    parser.add_argument("--no-twemproxy", action="store_true")
    parser.add_argument("--annotate", action="store_true")
    parser.add_argument("--cache", help="near-cache glob for the first Tollgate target")
    parser.add_argument("--lease", action="store_true", help="count a lease pair (see above)")
    parser.add_argument("--binary", default=os.path.join(e2e.ROOT, "target", "release", "tollgate"))
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "redis-server", "redis-benchmark", "nutcracker"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: run scripts/setup.sh (valgrind: apt-get install valgrind)")
    tests = args.tests.split(",")
    pipelines = (1, 16)
    e2e.raise_nofile()
    work = tempfile.mkdtemp(prefix="tollgate-instr-")
    procs = []
    rows = {}
    try:
        redis_sock = os.path.join(work, "redis.sock")
        procs.append(subprocess.Popen(e2e.redis_argv(work, redis_sock)))
        e2e.wait_for_socket(redis_sock)
        lanes_yaml = e2e.provision_lanes(args.binary, redis_sock, work)
        shas = load_scripts(redis_sock) if args.lease else None

        targets = []
        if not args.no_twemproxy:
            argv, nut_sock = e2e.nutcracker_argv(work, redis_sock)
            targets.append(("twemproxy", argv, nut_sock))
        for index, binary in enumerate([args.binary] + args.baseline):
            name = "tollgate" if index == 0 else f"baseline{index if index > 1 else ''}"
            config, sock = e2e.tollgate_config(work, name, redis_sock, lanes_yaml,
                                               None if index == 0 else os.path.abspath(binary))
            if index == 0 and args.cache:
                with open(config, "a") as conf:
                    conf.write(f"cache:\n  keys: [\"{args.cache}\"]\n")
            targets.append((name, [os.path.abspath(binary), "serve", "--config", config], sock))

        for name, argv, sock in targets:
            proc = subprocess.Popen(callgrind(argv, os.path.join(work, f"{name}.cg")),
                                    preexec_fn=e2e.raise_nofile, stderr=subprocess.DEVNULL)
            procs.append(proc)
            # Start-up runs uninstrumented, at native speed but for valgrind's own start.
            e2e.wait_for_socket(sock, timeout=120.0)
            if args.lease:
                figures = measure_lease(name, proc.pid, sock, args.requests, work,
                                        shas if name == "twemproxy" else None)
            else:
                figures = measure(name, proc.pid, sock, tests, args.requests, work, pipelines)
            for key, value in figures.items():
                rows.setdefault(key, {})[name] = value
            proc.terminate()
            proc.wait(timeout=60)
            print(f"{name} done", file=sys.stderr)

        names = [name for name, _, _ in targets]
        print(f"Command: `python3 benches/instructions.py --requests {args.requests} "
              + ("--lease" if args.lease else f"--tests {args.tests}")
              + " --baseline <older tollgate>" * len(args.baseline)
              + f"` (callgrind, redis-benchmark -c 50; instructions per request of the proxy, all threads)")
        print()
        ratios = [(a, b) for a in names if a != "twemproxy" for b in names if b != a and
                  (b == "twemproxy" or a == "tollgate")]
        print("| test | " + " | ".join(names) + " | " + " | ".join(f"{a}/{b}" for a, b in ratios) + " |")
        print("|---|" + "---|" * (len(names) + len(ratios)))
        for (test, pipeline), cells in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            label = f"{test.upper()}{' -P 16' if pipeline == 16 else ''}"
            print(f"| {label} | " + " | ".join(f"{cells[n][0]:,.0f}" for n in names) + " | "
                  + " | ".join(f"{cells[a][0] / cells[b][0]:.2f}" for a, b in ratios) + " |")
        if args.annotate:
            for (test, pipeline), cells in sorted(rows.items()):
                for name in names:
                    print(f"\n### {name} {test} -P {pipeline}: {cells[name][1]}")
                    out = subprocess.run(["callgrind_annotate", "--inclusive=no", cells[name][1]],
                                         capture_output=True, text=True).stdout
                    print("\n".join(out.splitlines()[:60]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if not args.annotate:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"\ndumps kept in {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
