#!/usr/bin/env python3
"""Redis Cluster benchmark: redis-benchmark against a local cluster directly (`--cluster`, the client
slot-aware) and through Tollgate's one socket (the client cluster-unaware), in one run.

Starts 3 masters with no replicas on free loopback ports (replicas would only add replication CPU
to the two cores the whole run shares, and neither target reads from them), provisions the daemon's
ACL users on every node as an operator would (`tollgate redis-acl`), and starts Tollgate with
`redis: { cluster: { addresses: [...] } }`. Runs SET, GET, INCR and LPUSH with 50 clients, keys
drawn from 1,000,000 (`-r`, so the commands spread over the slots), unpipelined and with -P 16,
several rounds interleaved across the two targets; reports the median of the rounds and ratios
tollgate/direct.

Each test is its own redis-benchmark run, so the CPU time the redis-server nodes and the daemon
used during it (utime+stime from /proc/<pid>/stat) can be divided by its requests: server-side CPU
per request, direct against nodes + daemon, and the daemon's share; redis-benchmark's own CPU comes
from getrusage(RUSAGE_CHILDREN). The -P 16 runs send --pipelined-requests (default 10x --requests):
they are ~10x faster, and the CPU times count in clock ticks (10 ms), so a run must last seconds
for the per-request figure to mean something.

Not MSET: redis-benchmark --cluster tags its ten keys into one slot, where the daemon, seeing ten
untagged keys through its socket, would split them into up to ten commands on three nodes; that is
not the same work. LPUSH pushes to one list per node directly (`mylist{tag}`) and to the one list
`mylist` through Tollgate: one node does that work.

--baseline runs another Tollgate binary (an earlier build) on the same cluster, as one more target in
the same rounds, with the ratio tollgate/baseline: this bench shares two cores among five processes
unpinned, and runs made one after the other do not separate two builds; runs interleaved can.

    python3 benches/cluster.py [--requests N] [--pipelined-requests N] [--rounds R] [--write BENCHMARKS.md]
                               [--no-build | --binary path/to/tollgate] [--baseline path/to/older/tollgate]
"""

import argparse
import csv
import io
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from e2e import keys_known_to, private_acl, raise_nofile, replace_section, stop_all  # benches/ is on sys.path when run as a script

TESTS = ("set", "get", "incr", "lpush")
MASTERS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
PROBE = b"*2\r\n$3\r\nGET\r\n$5\r\nprobe\r\n"


def free_cluster_ports(count):
    """Loopback ports whose cluster bus port (+10000) is free too."""
    ports = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        try:
            with socket.socket() as bus:
                bus.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        ports.append(port)
    return ports


def redis_cli(port, *args, stdin=None):
    return subprocess.run(["redis-cli", "-p", str(port), *args], input=stdin, capture_output=True,
                          text=True, check=True).stdout


def wait_until(what, ready, timeout=30.0, proc=None):
    """Polls `ready` until it is true; gives up at `timeout` or when `proc` has exited."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what}: no, it exited ({proc.returncode})")
        try:
            if ready():
                return
        except (OSError, subprocess.CalledProcessError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} within {timeout}s: no")


def answers_get(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(path)
        s.sendall(PROBE)
        return s.recv(64).startswith(b"$")


def cpu_seconds(pid):
    """utime + stime of every thread of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name may hold spaces: the fields after it start past the last ')'.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def benchmark(target_args, test, pipeline, requests, node_pids, daemon_pid):
    """One redis-benchmark run of `test`: (rps, p50, p99, node CPU s, daemon CPU s, client CPU s)."""
    nodes_before = sum(cpu_seconds(pid) for pid in node_pids)
    daemon_before = cpu_seconds(daemon_pid)
    client_before = children_cpu()
    out = subprocess.run(
        ["redis-benchmark", *target_args, "-c", "50", "-n", str(requests), "-r", "1000000",
         "-P", str(pipeline), "-t", test, "--csv"],
        capture_output=True, text=True, check=True,
    ).stdout
    client = children_cpu() - client_before
    daemon = cpu_seconds(daemon_pid) - daemon_before
    nodes = sum(cpu_seconds(pid) for pid in node_pids) - nodes_before
    # --cluster prints the masters it found before the CSV.
    rows = list(csv.DictReader(io.StringIO(out[out.find('"test"'):])))
    if len(rows) != 1:
        raise SystemExit(f"redis-benchmark {' '.join(target_args)} -t {test}: unexpected output\n{out}")
    row = rows[0]
    return (float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"]),
            nodes, daemon, client)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000, help="per unpipelined run")
    parser.add_argument("--pipelined-requests", type=int, help="per -P 16 run; default 10x --requests")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", help="replace the '## Redis Cluster' section of this Markdown file")
    parser.add_argument("--no-build", action="store_true", help="use target/release/tollgate as it is")
    parser.add_argument("--binary", help="the tollgate binary to run (implies --no-build)")
    parser.add_argument("--baseline", help="an older tollgate binary, run in the same rounds")
    args = parser.parse_args()
    args.pipelined_requests = args.pipelined_requests or 10 * args.requests
    for tool in ("redis-server", "redis-cli", "redis-benchmark"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: run scripts/setup.sh")
    raise_nofile()
    if args.binary:
        tollgate_bin = os.path.abspath(args.binary)
    else:
        if not args.no_build:
            subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "tollgate"], cwd=ROOT, check=True)
        tollgate_bin = os.path.join(ROOT, "target", "release", "tollgate")

    work = tempfile.mkdtemp(prefix="tollgate-cluster-bench-")
    procs = []
    keep_work = False
    try:
        ports = free_cluster_ports(MASTERS)
        nodes = []
        for port in ports:
            node = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{port}.conf", "--appendonly", "no", "--save", "",
                 "--dir", work, "--dbfilename", f"dump-{port}.rdb", "--logfile", os.path.join(work, f"redis-{port}.log")])
            procs.append(node)
            nodes.append(node)
        for port in ports:
            wait_until(f"redis-server on port {port} answers PING", lambda: redis_cli(port, "ping").strip() == "PONG")
        addresses = [f"127.0.0.1:{port}" for port in ports]
        subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
                       capture_output=True, text=True, check=True)
        # `create` returns once the nodes agree on the slots; wait until every node serves them.
        for port in ports:
            wait_until(f"node {port} says cluster_state:ok",
                       lambda: "cluster_state:ok" in redis_cli(port, "cluster", "info"))

        # The daemon's ACL users on every node, as an operator of an external cluster sets them up.
        passwords = os.path.join(work, "acl")
        acl = subprocess.run([tollgate_bin, "redis-acl", "--passwords", passwords],
                             check=True, capture_output=True, text=True).stdout
        for port in ports:
            redis_cli(port, stdin=private_acl(acl))
        lanes_yaml = subprocess.run([tollgate_bin, "redis-acl", "--passwords", passwords, "--lanes-yaml"],
                                    check=True, capture_output=True, text=True).stdout

        def start_tollgate(binary, name):
            """The daemon `name` on the cluster; an older build gets only the config keys it knows."""
            sock = os.path.join(work, f"{name}.sock")
            config = os.path.join(work, f"{name}.yaml")
            lanes, trusted = keys_known_to(None if name == "tollgate" else binary, lanes_yaml)
            with open(config, "w") as conf:
                conf.write(f"runtime_dir: {work}/{name}\nredis:\n  cluster:\n    addresses: "
                           f"[{', '.join(repr(a) for a in addresses)}]\n{trusted}"
                           f"listen:\n  resp: {sock}\n  http: {work}/{name}-http.sock\nlogging:\n  level: warn\n"
                           + lanes)
            log = open(os.path.join(work, f"{name}.log"), "w")
            proc = subprocess.Popen([binary, "serve", "--config", config], stdout=log, stderr=log,
                                    preexec_fn=raise_nofile)
            procs.append(proc)
            try:
                wait_until(f"{name} on {sock} answers GET", lambda: answers_get(sock), proc=proc)
            except SystemExit as failed:
                nonlocal keep_work
                keep_work = True
                raise SystemExit(f"{failed}; logs in {work}")
            return proc, sock

        tollgate, sock = start_tollgate(tollgate_bin, "tollgate")
        node_pids = [node.pid for node in nodes]
        targets = [("direct", ["--cluster", "-h", "127.0.0.1", "-p", str(ports[0])], tollgate.pid),
                   ("tollgate", ["-s", sock], tollgate.pid)]
        if args.baseline:
            baseline, baseline_sock = start_tollgate(os.path.abspath(args.baseline), "baseline")
            targets.append(("baseline", ["-s", baseline_sock], baseline.pid))
        load_before = os.getloadavg()
        results = {}  # (target, pipeline, test) -> [(rps, p50, p99, nodes s, daemon s, client s)]
        for round_no in range(args.rounds):
            for pipeline in (1, 16):
                for test in TESTS:
                    for name, target_args, daemon_pid in targets:
                        row = benchmark(target_args, test, pipeline, requests_for(args, pipeline), node_pids,
                                        daemon_pid)
                        results.setdefault((name, pipeline, test), []).append(row)
            print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)
        load_after = os.getloadavg()
        for name, _, daemon_pid in targets[1:]:
            proc = next(p for p in procs if p.pid == daemon_pid)
            if proc.poll() is not None:
                keep_work = True
                raise SystemExit(f"{name} exited during the run ({proc.returncode}); logs in {work}")

        report = render(args, results, load_before, load_after)
        print(report)
        if args.write:
            replace_section(args.write, "## Redis Cluster", report)
    finally:
        stop_all(procs)
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)


WHAT = """**What:** `benches/cluster.py` starts a Redis Cluster of 3 masters and no replicas on loopback
ports (replicas would only add replication CPU on two shared cores; neither target reads from
them), provisions the daemon's ACL users on every node with `tollgate redis-acl`, starts Tollgate
with `redis: { cluster: { addresses: [...] } }`, and runs redis-benchmark against both in the same
interleaved rounds: **direct** is `redis-benchmark --cluster` (slot-aware, one connection per client
to its node, keys hash-tagged to that node), **tollgate** is the unchanged cluster-unaware
`redis-benchmark -s` on the daemon's one socket (default policy: every command admitted). SET, GET,
INCR and LPUSH, `-c 50`, `-r 1000000`, unpipelined and `-P 16`, one redis-benchmark run per test so
that the CPU time (utime+stime in `/proc/<pid>/stat`) of the nodes and of the daemon during it can
be divided by its requests; redis-benchmark's own CPU from `getrusage(RUSAGE_CHILDREN)`. Not MSET:
`--cluster` tags its ten keys into one slot, where the daemon would split ten untagged keys over
the three nodes, which is not the same work. LPUSH pushes to one list per node directly
(`mylist{tag}`) and to the one list `mylist` (one node) through Tollgate."""


def requests_for(args, pipeline):
    return args.requests if pipeline == 1 else args.pipelined_requests


def ratio(a, b):
    return f"{a / b:.2f}" if b else "–"


def render(args, results, load_before, load_after):
    pipelined = "" if args.pipelined_requests == 10 * args.requests else \
        f" --pipelined-requests {args.pipelined_requests}"
    binary = " --binary <tollgate>" if args.binary else ""
    binary += " --baseline <older tollgate>" if args.baseline else ""
    lines = [WHAT, "",
             f"Command: `python3 benches/cluster.py --requests {args.requests}{pipelined} --rounds {args.rounds}{binary}` "
             f"(3 masters, no replicas, on loopback TCP; redis-benchmark -c 50 -r 1000000, -n {args.requests} "
             f"unpipelined and {args.pipelined_requests} with -P 16, "
             f"one run per test; direct: `--cluster` to the nodes over TCP, tollgate: one Unix socket; "
             f"median of {args.rounds} interleaved rounds; {os.cpu_count()} cores shared by the three "
             f"nodes, the daemon and redis-benchmark, not pinned; load average {load_before[0]:.2f} at the "
             f"start, {load_after[0]:.2f} at the end).", ""]
    for pipeline in (1, 16):
        us = 1e6 / requests_for(args, pipeline)
        lines.append(f"**{'unpipelined' if pipeline == 1 else '-P 16'}** — requests/s (p50 / p99 ms), "
                     "ratio; server-side CPU µs per request (direct: the nodes; tollgate: nodes + daemon), "
                     "the daemon's part, redis-benchmark's µs per request")
        lines.append("")
        header = ("| test | direct | tollgate | tollgate/direct | CPU direct | CPU tollgate (daemon) "
                  "| tollgate/direct CPU | client CPU direct / tollgate |")
        if args.baseline:
            header += " baseline | baseline (daemon) CPU | tollgate/baseline | daemon CPU tollgate/baseline |"
        lines.append(header)
        lines.append("|---" * header.count(" | ") + "|---|")
        for test in TESTS:
            med = {}
            for name in ("direct", "tollgate") + (("baseline",) if args.baseline else ()):
                rows = results[(name, pipeline, test)]
                med[name] = [statistics.median(r[i] for r in rows) for i in range(6)]
            d, t = med["direct"], med["tollgate"]
            cpu_direct = d[3] * us
            cpu_tollgate = (t[3] + t[4]) * us
            line = (f"| {test} | {d[0]:,.0f} ({d[1]:.3f} / {d[2]:.3f}) | {t[0]:,.0f} ({t[1]:.3f} / {t[2]:.3f}) "
                    f"| {ratio(t[0], d[0])} | {cpu_direct:.2f} | {cpu_tollgate:.2f} ({t[4] * us:.2f}) "
                    f"| {ratio(cpu_tollgate, cpu_direct)} | {d[5] * us:.2f} / {t[5] * us:.2f} |")
            if args.baseline:
                b = med["baseline"]
                line += (f" {b[0]:,.0f} ({b[1]:.3f} / {b[2]:.3f}) | {(b[3] + b[4]) * us:.2f} ({b[4] * us:.2f}) "
                         f"| {ratio(t[0], b[0])} | {ratio(t[4], b[4])} |")
            lines.append(line)
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
