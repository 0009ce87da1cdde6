#!/usr/bin/env python3
"""Where a proxied request's cost goes, counted rather than timed: for Tollgate (and a --baseline
build) beside twemproxy, per request of a redis-benchmark run (50 clients, Unix sockets) —

- syscalls (`perf stat -e raw_syscalls:sys_enter`) of the proxy and of redis-server behind it,
- context switches of the proxy (each is a thread going to sleep: the wake-ups it pays),
- CPU time of the proxy (/proc schedstat),
- heap allocations of the proxy (`heaptrack`, a run with the benchmark minus a run without it),
- and, with --profile, the proxy's hottest functions (`perf record -g`, self time).

Counts do not depend on how loaded the machine is, so this runs on a busy machine too; the
throughput figures belong to `benches/e2e.py`.

    python3 benches/breakdown.py [--requests N] [--no-build] [--baseline OLD_TOLLGATE] [--profile]
                                 [--no-heap] [--write BENCHMARKS.md]
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the same servers, sockets and ACL set-up as the end-to-end run)

MODES = [("GET", 1), ("SET", 1), ("GET", 16), ("SET", 16)]


def run_benchmark(sock, test, pipeline, requests):
    subprocess.run(["redis-benchmark", "-s", sock, "-c", "50", "-n", str(requests), "-P", str(pipeline),
                    "-t", test.lower(), "-q"], check=True, capture_output=True)


def perf_counts(pids, action):
    """Runs `action()` while `perf stat` counts syscalls and context switches of each pid."""
    stats = {}
    for pid in pids:
        out = tempfile.NamedTemporaryFile(delete=False, suffix=".perf")
        out.close()
        proc = subprocess.Popen(["perf", "stat", "-x", ",", "-o", out.name, "-e",
                                 "raw_syscalls:sys_enter,context-switches", "-p", str(pid)])
        stats[pid] = (proc, out.name)
    time.sleep(0.3)  # perf attached before the first request
    before = {pid: e2e.cpu_ns(pid) for pid in pids}
    action()
    cpu = {pid: e2e.cpu_ns(pid) - before[pid] for pid in pids}
    counts = {}
    for pid, (proc, path) in stats.items():
        proc.send_signal(signal.SIGINT)
        proc.wait()
        values = {}
        for line in open(path):
            fields = line.strip().split(",")
            if len(fields) > 2 and fields[0].replace(".", "").isdigit():
                values[fields[2]] = float(fields[0])
        os.unlink(path)
        counts[pid] = (values.get("raw_syscalls:sys_enter", float("nan")),
                       values.get("context-switches", float("nan")), cpu[pid])
    return counts


def daemon_pids(binary, config):
    """Processes running `binary ... --config config` (not the scripts that started them)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0] == binary.encode() and config.encode() in argv:
            pids.append(int(entry))
    return pids


def heap_calls(binary, config, sock, test, pipeline, requests):
    """Allocation calls per request of `binary serve --config config`: two runs under heaptrack,
    one serving the benchmark and one serving only the start-up probe."""
    totals = []
    for n in (requests, 0):
        work = tempfile.mkdtemp(prefix="tollgate-heap-")
        proc = subprocess.Popen(["heaptrack", "-o", os.path.join(work, "heap"), binary, "serve", "--config", config],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        e2e.wait_for_socket(sock, timeout=60)
        if n:
            run_benchmark(sock, test, pipeline, n)
        # `heaptrack` is a script: the daemon is its child, and is the one to stop.
        for daemon in daemon_pids(binary, config):
            os.kill(daemon, signal.SIGTERM)
        proc.wait(timeout=60)
        data = [f for f in os.listdir(work) if f.startswith("heap")]
        printed = subprocess.run(["heaptrack_print", "-f", os.path.join(work, data[0]), "-p", "0", "-a", "0",
                                  "-T", "0", "-l", "0", "-n", "0"],
                                 capture_output=True, text=True).stdout
        match = re.search(r"calls to allocation functions: (\d+)", printed)
        totals.append(int(match.group(1)) if match else 0)
        shutil.rmtree(work, ignore_errors=True)
    return (totals[0] - totals[1]) / requests


def hottest(pid, sock, test, pipeline, requests, limit=15):
    """The proxy's functions with the most self time over one run, as `perf report` lists them."""
    data = tempfile.NamedTemporaryFile(delete=False, suffix=".data")
    data.close()
    rec = subprocess.Popen(["perf", "record", "-g", "-o", data.name, "-p", str(pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    run_benchmark(sock, test, pipeline, requests)
    rec.send_signal(signal.SIGINT)
    rec.wait()
    report = subprocess.run(["perf", "report", "-i", data.name, "--no-children", "--stdio", "--percent-limit", "1",
                             "-g", "none", "--sort", "symbol"], capture_output=True, text=True).stdout
    os.unlink(data.name)
    rows = [re.sub(r"\s+", " ", line).strip().removesuffix(" - -")
            for line in report.splitlines() if line.strip() and not line.startswith("#")]
    return rows[:limit]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--baseline", help="another tollgate binary, counted the same way")
    parser.add_argument("--profile", action="store_true", help="also list the hottest functions (perf record)")
    parser.add_argument("--no-heap", action="store_true", help="skip the heaptrack runs (slow)")
    parser.add_argument("--write", help="replace the '## Per-request breakdown' section of this Markdown file")
    args = parser.parse_args()
    for tool in ("redis-server", "redis-benchmark", "nutcracker", "perf") + (() if args.no_heap else ("heaptrack",)):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found (scripts/setup.sh; apt-get install linux-perf heaptrack)")
    e2e.raise_nofile()
    root = e2e.ROOT
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "tollgate"], cwd=root, check=True)
    binaries = [("tollgate", os.path.join(root, "target", "release", "tollgate"))]
    if args.baseline:
        binaries.append(("baseline", os.path.abspath(args.baseline)))

    work = tempfile.mkdtemp(prefix="tollgate-breakdown-")
    procs = []
    try:
        redis_sock = os.path.join(work, "redis.sock")
        redis = subprocess.Popen(e2e.redis_argv(work, redis_sock))
        procs.append(redis)
        e2e.wait_for_socket(redis_sock)
        nut_argv, nut_sock = e2e.nutcracker_argv(work, redis_sock)
        nutcracker = subprocess.Popen(nut_argv, preexec_fn=e2e.raise_nofile)
        procs.append(nutcracker)
        e2e.wait_for_socket(nut_sock)

        lanes_yaml = e2e.provision_lanes(binaries[0][1], redis_sock, work)

        def config_for(name, binary):
            return e2e.tollgate_config(work, name, redis_sock, lanes_yaml,
                                       None if name == "tollgate" else binary)

        rows = []
        profiles = []
        targets = [("twemproxy", None, nut_sock, nutcracker.pid)]
        daemons = {}
        for name, binary in binaries:
            config, sock = config_for(name, binary)
            proc = subprocess.Popen([binary, "serve", "--config", config], preexec_fn=e2e.raise_nofile)
            procs.append(proc)
            e2e.wait_for_socket(sock)
            daemons[name] = (binary, config, sock, proc)
            targets.append((name, binary, sock, proc.pid))
        for test, pipeline in MODES:
            for name, binary, sock, pid in targets:
                counts = perf_counts([pid, redis.pid],
                                     lambda: run_benchmark(sock, test, pipeline, args.requests))
                syscalls, switches, cpu = counts[pid]
                redis_syscalls = counts[redis.pid][0]
                rows.append((test, pipeline, name, syscalls / args.requests, switches / args.requests,
                             cpu / 1000 / args.requests, redis_syscalls / args.requests))
                if args.profile and binary and pipeline in (1, 16) and test == "GET":
                    profiles.append((name, pipeline, hottest(pid, sock, test, pipeline, args.requests)))
        heap = {}
        if not args.no_heap:
            # heaptrack runs its own copy of each daemon on the same sockets: stop the measured ones.
            for name, (binary, config, sock, proc) in daemons.items():
                proc.terminate()
                proc.wait(timeout=30)
                for test, pipeline in MODES:
                    heap[(name, test, pipeline)] = heap_calls(binary, config, sock, test, pipeline,
                                                              min(args.requests, 50_000))

        load = os.getloadavg()
        lines = [f"Command: `python3 benches/breakdown.py --requests {args.requests}"
                 f"{' --baseline <older tollgate>' if args.baseline else ''}` (redis-benchmark -c 50, Unix sockets; "
                 f"counts per request; load average {load[0]:.2f}: counts do not depend on it, CPU time does).", "",
                 "| test | target | proxy syscalls | proxy context switches | proxy CPU µs | heap allocations "
                 "| redis-server syscalls |",
                 "|---|---|---|---|---|---|---|"]
        for test, pipeline, name, syscalls, switches, cpu, redis_syscalls in rows:
            allocs = heap.get((name, test, pipeline))
            allocs = f"{allocs:.2f}" if allocs is not None else "–"
            lines.append(f"| {test} -P {pipeline} | {name} | {syscalls:.2f} | {switches:.3f} | {cpu:.2f} | {allocs} "
                         f"| {redis_syscalls:.3f} |")
        lines.append("")
        for name, pipeline, top in profiles:
            lines.append(f"Hottest functions of {name}, GET -P {pipeline} (self time, `perf report --no-children`):")
            lines.append("")
            lines.append("```")
            lines.extend(top)
            lines.append("```")
            lines.append("")
        report = "\n".join(lines)
        print(report)
        if args.write:
            e2e.replace_section(args.write, "## Per-request breakdown", report)
    finally:
        e2e.stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
