#!/usr/bin/env python3
"""End-to-end benchmark: redis-benchmark against Redis directly, twemproxy (nutcracker) and Tollgate,
in one run, on Unix sockets, with the same redis-server behind both proxies.

Runs SET, GET, INCR, LPUSH, LRANGE_100 and MSET with 50 clients, unpipelined and with -P 16, several
rounds interleaved across the three targets; reports the median of the rounds and ratios against
direct Redis, and the CPU each proxy and redis-server spent per request (from /proc, one
redis-benchmark run per test). Then measures Tollgate's RSS idle, with 1,000 idle clients and with 100 subscribers.

    python3 benches/e2e.py [--requests N] [--rounds R] [--write BENCHMARKS.md] [--no-build]
                           [--baseline path/to/older/tollgate]... [--pin]

--baseline runs another Tollgate binary (an earlier build) as one more target in the same rounds, so
a change is measured before and after under the same load. Given more than once, each older build is
one more target (`baseline`, `baseline2`, …), e.g. the session's start and the issue's reference.

--pin puts redis-server and the proxies on the last CPU and redis-benchmark on the others. Left to
the scheduler, the three busy processes on two cores land differently from run to run and every
target swings between a fast and a slow regime; pinned, the runs repeat, and the figure answers
"what does the proxy cost on the core Redis runs on".
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

TESTS = "set,get,incr,lpush,lrange_100,mset"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def wait_for_socket(path, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            # GET rather than PING: twemproxy forwards only keyed commands.
            s.sendall(PROBE)
            if s.recv(64).startswith(b"$"):
                s.close()
                return
            s.close()
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{path} did not answer GET within {timeout}s")


PROBE = b"*2\r\n$3\r\nGET\r\n$5\r\nprobe\r\n"


def open_clients(path, count, first_command):
    """`count` connections that have each sent `first_command` and read its reply, so every
    proxy has fully set each client up before its memory is read."""
    clients = []
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        clients.append(s)
    for s in clients:
        s.sendall(first_command)
    for s in clients:
        s.recv(64)
    return clients


def free_port():
    """A loopback port for nutcracker's stats listener, which it insists on opening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_argv(work, redis_sock):
    """A redis-server private to the run, on a Unix socket only, persisting nothing."""
    return ["redis-server", "--port", "0", "--unixsocket", redis_sock, "--save", "", "--appendonly", "no",
            "--dir", work, "--logfile", os.path.join(work, "redis.log")]


def start_redis(work, procs):
    """Starts the run's redis-server on a socket in `work`, appended to `procs`; returns (its
    process, its socket) once it answers."""
    redis_sock = os.path.join(work, "redis.sock")
    redis = subprocess.Popen(redis_argv(work, redis_sock))
    procs.append(redis)
    wait_for_socket(redis_sock)
    return redis, redis_sock


def start_hop(work, redis_sock, hop_us, procs):
    """`tools/delay-relay` in front of `redis_sock`, every chunk `hop_us` µs late each way (a
    simulated network hop, as `benches/cache.py --hop-us` describes), appended to `procs`; returns
    the socket the targets reach Redis at: the relay's, or `redis_sock` itself when `hop_us` is 0."""
    if not hop_us:
        return redis_sock
    relay = os.path.join(ROOT, "target", "release", "delay-relay")
    if not os.path.exists(relay):
        raise SystemExit(f"{relay} not found: cargo build --release -p delay-relay")
    hop = os.path.join(work, "hop.sock")
    procs.append(subprocess.Popen([relay, "--listen", hop, "--upstream", redis_sock, "--delay-us", str(hop_us)]))
    wait_for_socket(hop)
    return hop


def nutcracker_argv(work, redis_sock):
    """twemproxy's command line in front of `redis_sock` (its config written to `work`), and the
    socket it listens on."""
    nut_sock = os.path.join(work, "nutcracker.sock")
    with open(os.path.join(work, "nutcracker.yml"), "w") as conf:
        conf.write(f"pool:\n  listen: {nut_sock} 0600\n  redis: true\n  hash: fnv1a_64\n"
                   f"  distribution: ketama\n  servers:\n   - {redis_sock}:1\n")
    argv = ["nutcracker", "-c", os.path.join(work, "nutcracker.yml"), "-o", os.path.join(work, "nutcracker.log"),
            "-a", "127.0.0.1", "-s", str(free_port()), "-p", os.path.join(work, "nutcracker.pid")]
    return argv, nut_sock


def private_acl(acl):
    """`tollgate redis-acl`'s lines for a redis-server private to this run: the lane and lease
    users, without the last two (an administrator, and `default` turned off). redis-benchmark's
    direct baseline and this script's own probes use `default`, so it stays on, and the daemon
    is told to trust it (`redis.trusted_users: [default]`), as an operator would have to."""
    return "".join(line for line in acl.splitlines(keepends=True)
                   if '"tollgate-root"' not in line and '"default" "off"' not in line)


def provision_lanes(tollgate_bin, redis_sock, work):
    """The daemon's ACL users on the run's redis-server, as an operator of an external Redis sets
    them up (docs/lanes.md); returns the `lanes:` YAML naming them."""
    passwords = os.path.join(work, "acl")
    acl = subprocess.run([tollgate_bin, "redis-acl", "--passwords", passwords],
                         check=True, capture_output=True, text=True).stdout
    subprocess.run(["redis-cli", "-s", redis_sock], input=private_acl(acl), check=True, capture_output=True,
                   text=True)
    return subprocess.run([tollgate_bin, "redis-acl", "--passwords", passwords, "--lanes-yaml"],
                          check=True, capture_output=True, text=True).stdout


def knows(binary, word):
    """Whether the tollgate `binary` has `word` among its strings (a config key it reads)."""
    with open(binary, "rb") as image:
        return word.encode() in image.read()


def keys_known_to(binary, lanes_yaml):
    """The `lanes:` YAML and the `redis.trusted_users` line for the tollgate `binary` (`None`: this
    build): an older build gets only the config keys it knows."""
    if binary is None:
        return lanes_yaml, "  trusted_users: [default]\n"
    # A build from before the lease service had connections of its own knows no `leases:` lane.
    lanes = lanes_yaml if knows(binary, "max_watchdogs") else "".join(
        line for line in lanes_yaml.splitlines(keepends=True) if not line.startswith("  leases:"))
    # Nor does a build from before tenants' scripts ran as scope users know `lanes.scopes`.
    if not knows(binary, "lanes.scopes"):
        lanes = "".join(line for line in lanes.splitlines(keepends=True) if not line.startswith("  scopes:"))
    # A build from before the start-up proof checked every Redis user knows no trusted_users.
    trusted = "  trusted_users: [default]\n" if knows(binary, "trusted_users") else ""
    return lanes, trusted


def tollgate_config(work, name, redis_sock, lanes_yaml, binary=None):
    """Writes the config of the daemon `name` (`tollgate`, or `baseline…` for an older build at
    `binary`) and returns (its path, its RESP socket). An older build gets only the keys it knows."""
    sock = os.path.join(work, f"{name}.sock")
    config = os.path.join(work, f"{name}.yaml")
    lanes, trusted = keys_known_to(binary, lanes_yaml)
    with open(config, "w") as conf:
        conf.write(f"runtime_dir: {work}/{name}\nredis:\n  address: unix:{redis_sock}\n{trusted}"
                   f"listen:\n  resp: {sock}\n  http: {work}/{name}-http.sock\nlogging:\n  level: warn\n"
                   + lanes)
    return config, sock


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pin(pid, cpus):
    """Pins every thread of `pid` to `cpus` (a taskset list)."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True)


def cpu_split():
    """(servers' CPU, clients' CPUs) for --pin: the last CPU for the servers, the rest for clients."""
    last = os.cpu_count() - 1
    return str(last), f"0-{last - 1}" if last > 1 else "0"


def cpu_ns(pid):
    """CPU time (ns) `pid` has run so far: the sum of its live threads' /proc/PID/task/*/schedstat
    (nanoseconds, where utime+stime counts clock ticks), or utime+stime when larger (it also counts
    threads that have exited)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                    total += int(stat.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass
    except FileNotFoundError:
        return 0
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    whole = (int(fields[11]) + int(fields[12])) * 1_000_000_000 // ticks
    return max(total, whole)


# redis-benchmark's `-r`: keys drawn at random from this many (`key:__rand_int__`); None: one key.
RANDOM_KEYS = None


def client_busy(before, started):
    """The CPUs' worth redis-benchmark (this process's waited-for children) was busy since
    `before` (`resource.getrusage(RUSAGE_CHILDREN)`) and `started` (`time.monotonic()`): near 1.0
    pinned to one CPU, the load generator is the bound, and no target can be told apart above it."""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return busy / max(time.monotonic() - started, 1e-9)


def client_busy_caption(client_cpus):
    """The line above a table of `client_busy` figures; `client_cpus` as `cpu_split` gives them
    (None unpinned)."""
    alone = client_cpus is not None and "," not in client_cpus and "-" not in client_cpus
    return ("redis-benchmark's own CPU over each run, in CPUs busy (median of the rounds"
            + ("; it has one CPU to itself, so 1.00 means the load generator is the bound" if alone else "")
            + ")")


def benchmark(sock, pipeline, requests, client_cpus=None, watch=()):
    """One redis-benchmark run per test, so that the CPU the watched processes spend (`watch`:
    name -> pid) is known per test: {test: (rps, p50, p99, {name: us per request, "client":
    redis-benchmark's busy share, see `client_busy`})}."""
    taskset = ["taskset", "-c", client_cpus] if client_cpus else []
    rows = {}
    for test in TESTS.split(","):
        before = {name: cpu_ns(pid) for name, pid in watch}
        usage, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        out = subprocess.run(
            taskset + ["redis-benchmark", "-s", sock, "-c", "50", "-n", str(requests), "-P", str(pipeline),
             "-t", test, "--csv"] + (["-r", str(RANDOM_KEYS)] if RANDOM_KEYS else []),
            capture_output=True, text=True, check=True,
        ).stdout
        cpu = {name: (cpu_ns(pid) - before[name]) / 1000 / requests for name, pid in watch}
        cpu["client"] = client_busy(usage, started)
        for row in csv.DictReader(io.StringIO(out)):
            if row["test"].startswith("LPUSH (needed"):
                continue  # "LPUSH (needed to benchmark LRANGE)": the prefill, not a test of its own
            name = row["test"].split(" ")[0]
            rows[name] = (float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"]), cpu)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", help="replace the '## End to end' section of this Markdown file")
    parser.add_argument("--no-build", action="store_true", help="use target/release/tollgate as it is")
    parser.add_argument("--baseline", action="append", default=[],
                        help="another tollgate binary to measure in the same rounds (repeatable)")
    parser.add_argument("--pin", action="store_true",
                        help="servers on the last CPU, redis-benchmark on the others")
    args = parser.parse_args()
    if args.pin and os.cpu_count() < 2:
        raise SystemExit("--pin needs at least two CPUs")
    server_cpus, client_cpus = cpu_split() if args.pin else (None, None)
    for tool in ("redis-server", "redis-benchmark", "nutcracker"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: run scripts/setup.sh")
    raise_nofile()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "tollgate"], cwd=ROOT, check=True)
    tollgate_bin = os.path.join(ROOT, "target", "release", "tollgate")

    work = tempfile.mkdtemp(prefix="tollgate-e2e-")
    procs = []
    try:
        redis_sock = os.path.join(work, "redis.sock")
        procs.append(subprocess.Popen(redis_argv(work, redis_sock)))
        wait_for_socket(redis_sock)

        nut_argv, nut_sock = nutcracker_argv(work, redis_sock)
        nutcracker = subprocess.Popen(nut_argv, preexec_fn=raise_nofile)
        procs.append(nutcracker)
        wait_for_socket(nut_sock)

        lanes_yaml = provision_lanes(tollgate_bin, redis_sock, work)

        def start_tollgate(binary, name):
            config, sock = tollgate_config(work, name, redis_sock, lanes_yaml,
                                           None if name == "tollgate" else binary)
            proc = subprocess.Popen([binary, "serve", "--config", config], preexec_fn=raise_nofile)
            procs.append(proc)
            wait_for_socket(sock)
            return proc, sock

        tollgate, tollgate_sock = start_tollgate(tollgate_bin, "tollgate")
        redis_pid = procs[0].pid
        targets = [("redis", redis_sock), ("twemproxy", nut_sock), ("tollgate", tollgate_sock)]
        # Whose CPU each target's rows count: Redis's always, and the proxy's own.
        watched = {"redis": [("redis", redis_pid)],
                   "twemproxy": [("redis", redis_pid), ("proxy", nutcracker.pid)],
                   "tollgate": [("redis", redis_pid), ("proxy", tollgate.pid)]}
        baselines = [f"baseline{index + 1 if index else ''}" for index in range(len(args.baseline))]
        for name, binary in zip(baselines, args.baseline):
            baseline, baseline_sock = start_tollgate(os.path.abspath(binary), name)
            targets.append((name, baseline_sock))
            watched[name] = [("redis", redis_pid), ("proxy", baseline.pid)]
        if args.pin:
            for proc in procs:
                pin(proc.pid, server_cpus)
        load_before = os.getloadavg()
        results = {}  # (target, pipeline, test) -> [(rps, p50, p99)]
        for round_no in range(args.rounds):
            for pipeline in (1, 16):
                for name, sock in targets:
                    rows = benchmark(sock, pipeline, args.requests, client_cpus, watched[name])
                    for test, row in rows.items():
                        results.setdefault((name, pipeline, test), []).append(row)
            print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)

        load_after = os.getloadavg()
        baseline_flag = " --baseline <older tollgate>" * len(args.baseline)
        baseline_flag += " --pin" if args.pin else ""
        lines = [f"Command: `python3 benches/e2e.py --requests {args.requests} --rounds {args.rounds}{baseline_flag}` "
                 f"(redis-benchmark -c 50 -n {args.requests}, Unix sockets, median of {args.rounds} interleaved rounds; "
                 f"{os.cpu_count()} cores shared by redis-server, the proxy and redis-benchmark"
                 f"{f' (servers pinned to CPU {server_cpus}, redis-benchmark to {client_cpus})' if args.pin else ''}; load average "
                 f"{load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end).", ""]
        names = [name for name, _ in targets]
        ratios = [("twemproxy", "redis"), ("tollgate", "redis"), ("tollgate", "twemproxy")]
        ratios += [("tollgate", name) for name in baselines]
        for pipeline in (1, 16):
            lines.append(f"**{'unpipelined' if pipeline == 1 else '-P 16'}** — requests/s (p50 / p99 ms); ratios")
            lines.append("")
            lines.append("| test | " + " | ".join(names) + " | " + " | ".join(f"{a}/{b}" for a, b in ratios) + " |")
            lines.append("|---|" + "---|" * (len(names) + len(ratios)))
            tests = sorted({t for (n, p, t) in results if p == pipeline})
            for test in tests:
                med = {}
                cells = []
                for name, _ in targets:
                    rows = results[(name, pipeline, test)]
                    rps = statistics.median(r[0] for r in rows)
                    p50 = statistics.median(r[1] for r in rows)
                    p99 = statistics.median(r[2] for r in rows)
                    med[name] = rps
                    cells.append(f"{rps:,.0f} ({p50:.3f} / {p99:.3f})")
                lines.append(f"| {test} | " + " | ".join(cells) + " | " +
                             " | ".join(f"{med[a] / med[b]:.2f}" for a, b in ratios) + " |")
            lines.append("")
            proxies = [name for name in names if name != "redis"]
            lines.append(f"CPU per request, µs (median of the rounds; /proc schedstat of each process over its own "
                         f"redis-benchmark run): the proxy's, and redis-server's behind it")
            lines.append("")
            lines.append("| test | " + " | ".join(f"{n} proxy" for n in proxies) + " | "
                         + " | ".join(f"redis via {n}" for n in names) + " | tollgate/twemproxy proxy CPU |")
            lines.append("|---|" + "---|" * (2 * len(proxies) + 2))
            for test in tests:
                def cpu(name, who):
                    values = [r[3].get(who) for r in results[(name, pipeline, test)] if who in r[3]]
                    return statistics.median(values) if values else float("nan")
                proxy_cells = [f"{cpu(n, 'proxy'):.2f}" for n in proxies]
                redis_cells = [f"{cpu(n, 'redis'):.2f}" for n in names]
                ratio = cpu("tollgate", "proxy") / cpu("twemproxy", "proxy")
                lines.append(f"| {test} | " + " | ".join(proxy_cells) + " | " + " | ".join(redis_cells)
                             + f" | {ratio:.2f} |")
            lines.append("")
            lines.append(client_busy_caption(client_cpus))
            lines.append("")
            lines.append("| test | " + " | ".join(names) + " |")
            lines.append("|---|" + "---|" * len(names))
            for test in tests:
                busy = [statistics.median(r[3]["client"] for r in results[(n, pipeline, test)]) for n in names]
                lines.append(f"| {test} | " + " | ".join(f"{b:.2f}" for b in busy) + " |")
            lines.append("")
            if "LRANGE_100" in tests:
                lines.append("(LRANGE_100's figures include redis-benchmark's prefill: as many LPUSHes as reads.)")
                lines.append("")

        # Memory: idle, 1,000 idle clients, 100 subscribers.
        idle = rss_kib(tollgate.pid)
        clients = open_clients(tollgate_sock, 1000, PROBE)
        with_clients = rss_kib(tollgate.pid)
        nut_clients = open_clients(nut_sock, 1000, PROBE)
        nut_rss = rss_kib(nutcracker.pid)
        for s in clients + nut_clients:
            s.close()
        subscribers = open_clients(tollgate_sock, 100, b"SUBSCRIBE news\r\n")
        with_subscribers = rss_kib(tollgate.pid)
        for s in subscribers:
            s.close()
        lines.append("**Memory (RSS)**")
        lines.append("")
        lines.append("| state | tollgate | twemproxy |")
        lines.append("|---|---|---|")
        lines.append(f"| after the benchmark, idle | {idle / 1024:.1f} MiB | |")
        lines.append(f"| 1,000 idle client connections | {with_clients / 1024:.1f} MiB | {nut_rss / 1024:.1f} MiB |")
        lines.append(f"| 100 subscribers on one channel | {with_subscribers / 1024:.1f} MiB | |")
        lines.append("")
        report = "\n".join(lines)
        print(report)
        if args.write:
            replace_section(args.write, "## End to end", report)
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


def stop_all(procs):
    """Terminates `procs` (the last started first), killing what has not exited within 10 s."""
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def replace_section(path, heading, body):
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    start = text.find(heading + "\n")
    if start == -1:
        text = text.rstrip("\n") + f"\n\n{heading}\n\n{body}\n"
    else:
        end = text.find("\n## ", start + len(heading))
        end = len(text) if end == -1 else end + 1
        text = text[:start] + f"{heading}\n\n{body}\n" + ("\n" + text[end:] if end < len(text) else "")
    open(path, "w").write(text)


if __name__ == "__main__":
    main()
