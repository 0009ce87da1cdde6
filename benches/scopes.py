#!/usr/bin/env python3
"""Scopes (issue 30): what a tenant's scripts cost. A scoped EVAL beside an unconstrained one, and
the connections and memory 100 scopes take.

One daemon (the release `tollgate`) with its embedded redis-server (scope users are made on the
embedded Redis only) and a policy of 100 tenants `t000`…`t099`, each a principal by uid (30000+i,
no passwd entry needed), each with one allow rule on its keys `tNNN:*` for EVAL, EVALSHA, GET and
SET, so its scripts run as its scope's ACL user; and one principal `free` (uid 0, this script)
whose rule on `free:*` says `scripts: unconstrained`, so its scripts run on the shared SCRIPT
lane. `lanes.scopes.max` is raised to 128 (default 64), one connection per scope and protocol.

1. Cost of 100 scopes. Before any tenant has run a script (but after as many redis-cli runs of
   the same EVAL as free, so that client churn and the script cache are the same on both sides),
   right after each of the 100 tenants has run one `EVAL` (redis-cli under its uid, via
   setpriv), and once more after `lanes.scopes.idle` has passed: Redis's `connected_clients` and `used_memory`, the number of
   ACL users (`ACL LIST`, as the embedded server's administrator `tollgate-root`, whose password
   the daemon leaves in its runtime directory), connections named `tollgate-scope` (`CLIENT
   LIST`) and the daemon's RSS. A second daemon, started first with the same config and a policy
   without the tenants, gives what the 100 scope users cost Redis before any pool is opened
   (they are made at start).
2. Scoped vs unconstrained EVAL. redis-benchmark `-c 10 -n N` of
   `EVAL "return redis.call('GET', KEYS[1])" 1 <key>` on the daemon's RESP socket, as t000
   (key `t000:k`, under setpriv) and as root/free (key `free:k`), and direct to the embedded
   Redis as its administrator for reference; unpipelined and with `-P 16`, several rounds
   interleaved; medians of requests/s, p50 and p99, and the CPU the daemon and redis-server each
   spent per request (/proc, as e2e.py counts it).
3. Scoped vs unconstrained transaction. One client (the system's python, under the tenant's uid)
   sends `MULTI`, the same EVAL and `EXEC` at once and reads the three replies, requests/20 times
   in a row (at least 1,000), as t000 and as free, interleaved rounds: a scoped transaction runs
   on its TRANSACTION connection logged in as the scope user (one `AUTH` when it pins, one when
   it ends), an unconstrained one as the lane's user.

    python3 benches/scopes.py [--requests N] [--rounds R] [--pin] [--binary PATH]
                              [--tenants 100] [--max 128] [--connections 1] [--idle 10s]

--connections sets `lanes.scopes.connections` (the SCRIPT lane has 2 per protocol; a scope 1 by
default), to tell a scope's own cost from that of its smaller pool.

--pin, as in e2e.py: the daemon and redis-server on the last CPU, redis-benchmark and redis-cli on
the others. Needs root (the tenants are other uids). Prints Markdown and the exact command.
"""

import argparse
import csv
import datetime
import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (pinning, CPU accounting, RSS, stopping processes)

FIRST_UID = 30000
SCRIPT = "return redis.call('GET', KEYS[1])"
OPENING = "redis.call('GET', KEYS[1]); return 'ok'"  # each tenant's first script (creates no key)
ADMIN_USER = "tollgate-root"  # tollgate_lanes::EMBEDDED_ADMIN


def tenant(index):
    return f"t{index:03d}"


def policy_yaml(tenants):
    """`tenants` principals by uid, each confined to its own keys (scoped scripts), and `free`
    (root), whose scripts are unconstrained."""
    lines = ["principals:", "  free: { uids: [0] }"]
    lines += [f"  {tenant(i)}: {{ uids: [{FIRST_UID + i}] }}" for i in range(tenants)]
    lines += ["rules:",
              "  - id: connection",
              "    commands: [PING, HELLO, CLIENT SETNAME, CLIENT GETNAME, CLIENT ID, QUIT, RESET, ECHO]",
              "    allow: connection housekeeping",
              "  - id: transactions",
              "    commands: [MULTI, EXEC, DISCARD]",
              "    allow: transactions (their commands are judged as they are queued)"]
    for i in range(tenants):
        lines += [f"  - id: {tenant(i)}-keys",
                  f"    principals: [{tenant(i)}]",
                  "    commands: [EVAL, EVALSHA, GET, SET]",
                  f"    keys: [\"{tenant(i)}:*\"]",
                  "    allow: its own keys; its scripts run in its scope"]
    lines += ["  - id: free-keys",
              "    principals: [free]",
              "    commands: [EVAL, EVALSHA, GET, SET]",
              "    keys: [\"free:*\"]",
              "    scripts: unconstrained",
              "    allow: its scripts run on the shared SCRIPT lane"]
    return "\n".join(lines) + "\n"


class Resp:
    """A minimal RESP2 client (this script's probes)."""

    def __init__(self, path, deadline_s=30.0):
        deadline = time.time() + deadline_s
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(path)
                break
            except OSError:
                self.sock.close()
                if time.time() > deadline:
                    raise SystemExit(f"{path}: nothing listening after {deadline_s}s")
                time.sleep(0.05)
        self.buf = b""

    def call(self, *args):
        out = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            arg = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
        self.sock.sendall(b"".join(out))
        return self.read()

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self.buf) < size + 2:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                self.buf += chunk
            data, self.buf = self.buf[:size], self.buf[size + 2:]
            return data.decode(errors="replace")
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self.read() for _ in range(size)]
        raise ValueError(f"unexpected reply {line!r}")

    def close(self):
        self.sock.close()


def ok(reply, what):
    if isinstance(reply, Exception):
        raise SystemExit(f"{what}: {reply}")
    return reply


def info_field(text, name):
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise KeyError(name)


def as_uid(uid):
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


class Daemon:
    """A daemon with its embedded redis-server, in a temporary directory of its own."""

    def __init__(self, binary, tenants, args, name):
        self.work = tempfile.mkdtemp(prefix=f"tollgate-scopes-{name}-")
        os.chmod(self.work, 0o755)  # the tenants' uids reach the sockets through it
        self.resp = os.path.join(self.work, "resp.sock")
        run = os.path.join(self.work, "run")
        self.redis_sock = os.path.join(run, "redis.sock")
        policy = os.path.join(self.work, "policy.yaml")
        with open(policy, "w") as out:
            out.write(policy_yaml(tenants))
        self.config = os.path.join(self.work, "tollgate.yaml")
        with open(self.config, "w") as conf:
            conf.write(f"runtime_dir: {run}\n"
                       f"listen:\n  resp: {self.resp}\n  http: {self.work}/http.sock\n  mode: \"0666\"\n"
                       f"logging:\n  level: warn\n"
                       f"lanes:\n  scopes:\n    max: {args.max}\n    connections: {args.connections}\n    idle: {args.idle}\n"
                       f"policy:\n  files: [{policy}]\n")
        self.log = open(os.path.join(self.work, "tollgate.log"), "w")
        self.proc = subprocess.Popen([binary, "serve", "--config", self.config], stdout=self.log,
                                     stderr=self.log, preexec_fn=e2e.raise_nofile)
        probe = Resp(self.resp)
        while ok(probe.call("PING"), "PING through the daemon") != "PONG":
            time.sleep(0.05)
        probe.close()
        with open(os.path.join(run, "admin.password")) as pw:
            self.admin_password = pw.read().strip()
        self.admin = Resp(self.redis_sock)
        ok(self.admin.call("AUTH", ADMIN_USER, self.admin_password), "AUTH as the embedded admin")
        self.redis_pid = int(info_field(ok(self.admin.call("INFO", "server"), "INFO server"), "process_id"))

    def state(self):
        """What the scopes cost, as Redis and /proc tell it."""
        clients = ok(self.admin.call("INFO", "clients"), "INFO clients")
        memory = ok(self.admin.call("INFO", "memory"), "INFO memory")
        users = ok(self.admin.call("ACL", "USERS"), "ACL USERS")
        acl_list = ok(self.admin.call("ACL", "LIST"), "ACL LIST")
        listing = ok(self.admin.call("CLIENT", "LIST"), "CLIENT LIST")
        scope_conns = sum(1 for line in listing.splitlines() if " name=tollgate-scope " in f" {line} ")
        return {
            "connected_clients": int(info_field(clients, "connected_clients")),
            "scope_connections": scope_conns,
            "acl_users": len(acl_list),
            "scope_users": sum(1 for u in users if u.startswith("tollgate-scope-")),
            "used_memory": int(info_field(memory, "used_memory")),
            "daemon_rss_kib": e2e.rss_kib(self.proc.pid),
            "redis_rss_kib": e2e.rss_kib(self.redis_pid),
        }

    def stop(self):
        try:
            self.admin.close()
        except OSError:
            pass
        e2e.stop_all([self.proc])
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def settle_state(daemon):
    """`state()` after 2 s, so that a just-closed client is gone and redis-server's clientsCron
    has trimmed the new clients' query buffers."""
    time.sleep(2.0)
    return daemon.state()


def warm_up(daemon, count, client_cpus):
    """The same client churn as the tenants' first scripts, `count` redis-cli runs of the same
    EVAL as root (`free`, unconstrained: no scope), so that the state before the tenants differs
    from the state after them by their scopes only; then waits for the daemon's RSS to settle."""
    for _ in range(count):
        done = cli(daemon.resp, 0, ["EVAL", OPENING, "1", "free:k"], client_cpus)
        if done.stdout.strip() != "ok":
            raise SystemExit(f"free's EVAL: {(done.stdout + done.stderr).strip()}")
    last, deadline = None, time.time() + 15
    while time.time() < deadline:
        time.sleep(1.0)
        rss = e2e.rss_kib(daemon.proc.pid)
        if rss == last:
            break
        last = rss


def cli(sock, uid, argv, client_cpus):
    taskset = ["taskset", "-c", client_cpus] if client_cpus else []
    prefix = as_uid(uid) if uid else []
    return subprocess.run(taskset + prefix + ["redis-cli", "-s", sock] + argv, capture_output=True, text=True)


def run_bench(sock, uid, key, pipeline, requests, client_cpus, watch, auth=()):
    """One redis-benchmark run of the EVAL: (rps, p50, p99, {who: µs of CPU per request})."""
    taskset = ["taskset", "-c", client_cpus] if client_cpus else []
    prefix = as_uid(uid) if uid else []
    before = {name: e2e.cpu_ns(pid) for name, pid in watch}
    done = subprocess.run(
        taskset + prefix + ["redis-benchmark", "-s", sock, *auth, "-c", "10", "-n", str(requests),
                            "-P", str(pipeline), "--csv", "EVAL", SCRIPT, "1", key],
        capture_output=True, text=True)
    cpu = {name: (e2e.cpu_ns(pid) - before[name]) / 1000 / requests for name, pid in watch}
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    if done.returncode != 0 or not rows:
        raise SystemExit(f"redis-benchmark as uid {uid} on {key} (-P {pipeline}) failed "
                         f"(exit {done.returncode}): {done.stdout.strip()} {done.stderr.strip()}")
    row = rows[-1]
    return float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"]), cpu


# One client's transactions, `MULTI`, the EVAL and `EXEC` written at once and their three replies
# read, run as a tenant's uid by the system's python (an OS user cannot run a pyenv one under
# /root): prints the seconds `n` of them took.
TRANSACTIONS = r"""
import socket, sys, time
path, key, n = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
def command(*words):
    out = [b"*%d\r\n" % len(words)]
    for w in words:
        out.append(b"$%d\r\n%s\r\n" % (len(w), w))
    return b"".join(out)
script = b"return redis.call('GET', KEYS[1])"
batch = command(b"MULTI") + command(b"EVAL", script, b"1", key) + command(b"EXEC")
want = b"+OK\r\n+QUEUED\r\n*1\r\n$1\r\nv\r\n"
s = socket.socket(socket.AF_UNIX)
s.connect(path)
t0 = time.perf_counter()
for _ in range(n):
    s.sendall(batch)
    got = b""
    while len(got) < len(want):
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("closed")
        got += chunk
    if got != want:
        sys.exit("unexpected: %r" % got)
print(time.perf_counter() - t0)
"""


def run_transactions(sock, uid, key, count, client_cpus, watch):
    """One client's `count` transactions: (µs per transaction, {who: µs of CPU per transaction})."""
    taskset = ["taskset", "-c", client_cpus] if client_cpus else []
    prefix = as_uid(uid) if uid else []
    before = {name: e2e.cpu_ns(pid) for name, pid in watch}
    done = subprocess.run(taskset + prefix + ["/usr/bin/python3", "-c", TRANSACTIONS, sock, key, str(count)],
                          capture_output=True, text=True)
    cpu = {name: (e2e.cpu_ns(pid) - before[name]) / 1000 / count for name, pid in watch}
    if done.returncode != 0:
        raise SystemExit(f"transactions as uid {uid} on {key} failed: {done.stdout.strip()} {done.stderr.strip()}")
    return float(done.stdout) * 1e6 / count, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--max", type=int, default=128, help="lanes.scopes.max (default 64 in the daemon)")
    parser.add_argument("--connections", type=int, default=1, help="lanes.scopes.connections (default 1)")
    parser.add_argument("--idle", default="10s", help="lanes.scopes.idle (default 60s in the daemon)")
    parser.add_argument("--binary", default=os.path.join(e2e.ROOT, "target", "release", "tollgate"))
    parser.add_argument("--pin", action="store_true",
                        help="the daemon and redis-server on the last CPU, the clients on the others")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the tenants are processes under other uids (setpriv)")
    if args.pin and os.cpu_count() < 2:
        raise SystemExit("--pin needs at least two CPUs")
    for tool in ("redis-server", "redis-benchmark", "redis-cli", "setpriv", "taskset"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: run scripts/setup.sh")
    server_cpus, client_cpus = e2e.cpu_split() if args.pin else (None, None)
    e2e.raise_nofile()
    binary = os.path.abspath(args.binary)
    idle_s = float(args.idle.rstrip("s")) if args.idle.endswith("s") and args.idle[:-1].replace(".", "").isdigit() \
        else 60.0

    load_before = os.getloadavg()
    started = datetime.datetime.now().astimezone()
    lines = []
    daemons = []
    try:
        # The same daemon without the tenants: what their scope users cost at start.
        bare = Daemon(binary, 0, args, "bare")
        daemons.append(bare)
        warm_up(bare, args.tenants, client_cpus)
        bare_state = settle_state(bare)
        bare.stop()
        daemons.remove(bare)

        daemon = Daemon(binary, args.tenants, args, "tenants")
        daemons.append(daemon)
        if args.pin:
            e2e.pin(daemon.proc.pid, server_cpus)
            e2e.pin(daemon.redis_pid, server_cpus)
        warm_up(daemon, args.tenants, client_cpus)

        # 1. Cost of the scopes: none opened, every tenant's opened, after idle closing.
        before = settle_state(daemon)
        failures = []

        first_rss = []  # the daemon's RSS right after the very first tenant's EVAL

        def open_scopes():
            t0 = time.perf_counter()
            for i in range(args.tenants):
                done = cli(daemon.resp, FIRST_UID + i, ["EVAL", OPENING, "1", f"{tenant(i)}:k"], client_cpus)
                if done.stdout.strip() != "ok":
                    failures.append(f"{tenant(i)}: {(done.stdout + done.stderr).strip()}")
                if not first_rss:
                    time.sleep(1.0)
                    first_rss.append(e2e.rss_kib(daemon.proc.pid))
            return time.perf_counter() - t0

        def wait_closed():
            deadline = time.time() + idle_s * 3 + 5
            while time.time() < deadline:
                time.sleep(1.0)
                if daemon.state()["scope_connections"] == 0:
                    return True
            return False

        opening_s = open_scopes()
        after = settle_state(daemon)
        # A tenant's EVAL of a key outside its scope, built at run time: Redis must refuse it.
        escape = cli(daemon.resp, FIRST_UID, ["EVAL", "return redis.call('GET', 't0' .. '01:k')", "1", "t000:k"],
                     client_cpus)
        escape_text = (escape.stdout + escape.stderr).strip()
        closed_at = wait_closed()
        after_idle = settle_state(daemon)
        # Once more, now that both sides of the difference come after the first opening.
        reopening_s = open_scopes()
        reopened = settle_state(daemon)
        closed_again = wait_closed()
        after_idle2 = settle_state(daemon)
        print(f"scopes: {args.tenants} opened in {opening_s:.1f}s, {len(failures)} failures", file=sys.stderr)

        # 2. Scoped vs unconstrained EVAL.
        ok(daemon.admin.call("SET", "t000:k", "v"), "SET t000:k")
        ok(daemon.admin.call("SET", "free:k", "v"), "SET free:k")
        ok(daemon.admin.call("SET", "direct:k", "v"), "SET direct:k")
        watch = [("daemon", daemon.proc.pid), ("redis", daemon.redis_pid)]
        targets = [
            ("scoped (t000 via tollgate)", daemon.resp, FIRST_UID, "t000:k", ()),
            ("unconstrained (free via tollgate)", daemon.resp, 0, "free:k", ()),
            ("direct to Redis (admin)", daemon.redis_sock, 0, "direct:k",
             ("--user", ADMIN_USER, "-a", daemon.admin_password)),
        ]
        results = {}
        for round_no in range(args.rounds):
            for pipeline in (1, 16):
                for label, sock, uid, key, auth in targets:
                    row = run_bench(sock, uid, key, pipeline, args.requests, client_cpus,
                                    watch if sock == daemon.resp else watch[1:], auth)
                    results.setdefault((label, pipeline), []).append(row)
            print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)
        during_bench = daemon.state()

        # 3. Scoped vs unconstrained transaction (MULTI, the EVAL, EXEC): a scoped one runs on its
        # TRANSACTION connection logged in as the scope user, and logs back in at EXEC.
        tx_count = max(1000, args.requests // 20)
        tx_targets = [("scoped (t000)", FIRST_UID, "t000:k"), ("unconstrained (free)", 0, "free:k")]
        tx_results = {}
        for _ in range(args.rounds):
            for label, uid, key in tx_targets:
                tx_results.setdefault(label, []).append(
                    run_transactions(daemon.resp, uid, key, tx_count, client_cpus, watch))
        load_after = os.getloadavg()

        # Report.
        flags = f" --requests {args.requests} --rounds {args.rounds}"
        flags += f" --tenants {args.tenants}" if args.tenants != 100 else ""
        flags += f" --max {args.max}" if args.max != 128 else ""
        flags += f" --connections {args.connections}" if args.connections != 1 else ""
        flags += f" --idle {args.idle}" if args.idle != "10s" else ""
        flags += " --pin" if args.pin else ""
        lines.append(f"Command: `python3 benches/scopes.py{flags}` ({started:%Y-%m-%d %H:%M %Z}; release binary "
                     f"built {datetime.datetime.fromtimestamp(os.path.getmtime(binary)):%Y-%m-%d %H:%M}; "
                     f"embedded redis-server {info_field(ok(daemon.admin.call('INFO', 'server'), 'INFO'), 'redis_version')}; "
                     f"`lanes.scopes: {{max: {args.max}, connections: {args.connections}, idle: {args.idle}}}`; "
                     f"{os.cpu_count()} cores"
                     f"{f', daemon and redis-server pinned to CPU {server_cpus}, clients to {client_cpus}' if args.pin else ''}; "
                     f"load average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end).")
        lines.append("")
        lines.append(f"**EVAL `{SCRIPT}` 1 <key>**, redis-benchmark -c 10 -n {args.requests}, median of "
                     f"{args.rounds} interleaved rounds: requests/s (p50 / p99 ms); CPU µs per request")
        lines.append("")
        lines.append("| target | unpipelined | -P 16 | daemon CPU µs/req (1 / 16) | redis CPU µs/req (1 / 16) |")
        lines.append("|---|---|---|---|---|")
        med = {}
        for label, *_ in targets:
            cells, daemon_cpu, redis_cpu = [], [], []
            for pipeline in (1, 16):
                rows = results[(label, pipeline)]
                rps = statistics.median(r[0] for r in rows)
                med[(label, pipeline)] = (rps, statistics.median(r[1] for r in rows))
                cells.append(f"{rps:,.0f} ({statistics.median(r[1] for r in rows):.3f} / "
                             f"{statistics.median(r[2] for r in rows):.3f})")
                d = [r[3]["daemon"] for r in rows if "daemon" in r[3]]
                daemon_cpu.append(f"{statistics.median(d):.2f}" if d else "–")
                redis_cpu.append(f"{statistics.median(r[3]['redis'] for r in rows):.2f}")
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {' / '.join(daemon_cpu)} | {' / '.join(redis_cpu)} |")
        lines.append("")
        scoped, free, direct = (t[0] for t in targets)
        lines.append("Ratios of the medians, requests/s: "
                     + "; ".join(f"{'unpipelined' if p == 1 else '-P 16'} scoped/unconstrained "
                                 f"{med[(scoped, p)][0] / med[(free, p)][0]:.2f}, scoped/direct "
                                 f"{med[(scoped, p)][0] / med[(direct, p)][0]:.2f}, unconstrained/direct "
                                 f"{med[(free, p)][0] / med[(direct, p)][0]:.2f}" for p in (1, 16)) + ".")
        lines.append("")
        lines.append("Every round's requests/s (scoped, unconstrained, direct): "
                     + "; ".join(f"{'unpipelined' if p == 1 else '-P 16'} "
                                 + ", ".join("/".join(f"{r[0]:,.0f}" for r in results[(t[0], p)]) for t in targets)
                                 for p in (1, 16)) + ".")
        lines.append("")

        lines.append(f"**Transactions**: one client's `MULTI`, `EVAL \"{SCRIPT}\" 1 <key>`, `EXEC`, written at "
                     f"once, {tx_count:,} in a row, median of {args.rounds} interleaved rounds")
        lines.append("")
        lines.append("| target | µs per transaction | daemon CPU µs per transaction | redis CPU µs per transaction |")
        lines.append("|---|---|---|---|")
        tx_med = {}
        for label, *_ in tx_targets:
            rows = tx_results[label]
            tx_med[label] = statistics.median(r[0] for r in rows)
            lines.append(f"| {label} | {tx_med[label]:.1f} | "
                         f"{statistics.median(r[1]['daemon'] for r in rows):.2f} | "
                         f"{statistics.median(r[1]['redis'] for r in rows):.2f} |")
        lines.append("")
        lines.append(f"Scoped/unconstrained time per transaction: "
                     f"{tx_med[tx_targets[0][0]] / tx_med[tx_targets[1][0]]:.2f}; every round's µs (scoped, "
                     f"unconstrained): " + ", ".join("/".join(f"{r[0]:.1f}" for r in tx_results[t[0]])
                                                     for t in tx_targets) + ".")
        lines.append("")

        n = args.tenants
        lines.append(f"**Cost of {n} scopes** (Redis `INFO`, `ACL LIST`, `CLIENT LIST` as the embedded admin; "
                     f"/proc VmRSS)")
        lines.append("")
        lines.append("| state | connected_clients | `tollgate-scope` connections | ACL users (scope users) "
                     "| Redis used_memory | Redis RSS | daemon RSS |")
        lines.append("|---|---|---|---|---|---|---|")

        def row(label, s):
            lines.append(f"| {label} | {s['connected_clients']} | {s['scope_connections']} | {s['acl_users']} "
                         f"({s['scope_users']}) | {s['used_memory']:,} B | {s['redis_rss_kib'] / 1024:.1f} MiB "
                         f"| {s['daemon_rss_kib'] / 1024:.1f} MiB |")

        row(f"same config, policy without the tenants (after {n} EVALs as free)", bare_state)
        row(f"{n} tenants, none has run a script (after {n} EVALs as free)", before)
        row(f"after each tenant's one EVAL (pools open)", after)
        row(f"after lanes.scopes.idle ({args.idle}) passed"
            + ("" if closed_at else " — pools still open at the deadline"), after_idle)
        row("each tenant's EVAL again (pools reopened)", reopened)
        row(f"after lanes.scopes.idle passed again"
            + ("" if closed_again else " — pools still open at the deadline"), after_idle2)
        row("right after the EVAL benchmark (t000's pool)", during_bench)
        lines.append("")
        reopen_mem = (reopened["used_memory"] - after_idle["used_memory"]) / n
        reopen_rss = (reopened["daemon_rss_kib"] - after_idle["daemon_rss_kib"]) / n
        conns = (after["connected_clients"] - before["connected_clients"]) / n
        scope_conns = (after["scope_connections"] - before["scope_connections"]) / n
        mem_open = (after["used_memory"] - before["used_memory"]) / n
        rss_open = (after["daemon_rss_kib"] - before["daemon_rss_kib"]) / n
        mem_users = (before["used_memory"] - bare_state["used_memory"]) / n
        rss_policy = (before["daemon_rss_kib"] - bare_state["daemon_rss_kib"]) / n
        lines.append("| per scope | value |")
        lines.append("|---|---|")
        lines.append(f"| Redis connections per opened scope | {conns:.2f} ({scope_conns:.2f} named tollgate-scope) |")
        lines.append(f"| Redis used_memory per opened scope, first opening (after − before) | {mem_open:,.0f} B |")
        lines.append(f"| daemon RSS per opened scope, first opening (after − before) | {rss_open:.1f} KiB |")
        if n > 1:
            lines.append(f"| daemon RSS per opened scope, from 1 s after the first tenant's EVAL to all {n} open "
                         f"| {(after['daemon_rss_kib'] - first_rss[0]) / (n - 1):.1f} KiB |")
        lines.append(f"| Redis used_memory per reopened scope (reopened − closed) | {reopen_mem:,.0f} B |")
        lines.append(f"| daemon RSS per reopened scope (reopened − closed) | {reopen_rss:.1f} KiB |")
        lines.append(f"| Redis used_memory per scope user, made at start (vs the policy without tenants) "
                     f"| {mem_users:,.0f} B |")
        lines.append(f"| daemon RSS per tenant at start (policy, principal, scope; vs without tenants) "
                     f"| {rss_policy:.1f} KiB |")
        lines.append(f"| time to open {n} scopes, one redis-cli EVAL each, sequentially | {opening_s:.1f} s "
                     f"({opening_s / n * 1000:.0f} ms per tenant, process start included; {reopening_s:.1f} s again) |")
        lines.append("")
        lines.append(f"Daemon RSS 1 s after the first tenant's first EVAL: {first_rss[0]:,} KiB "
                     f"(before it: {before['daemon_rss_kib']:,} KiB; all {n} open: {after['daemon_rss_kib']:,} KiB; "
                     f"closed: {after_idle['daemon_rss_kib']:,} KiB; reopened: {reopened['daemon_rss_kib']:,} KiB).")
        lines.append("")
        lines.append(f"Failures opening scopes: {len(failures)}"
                     + ("" if not failures else " — " + "; ".join(failures[:5])))
        lines.append("")
        lines.append(f"t000's `EVAL \"return redis.call('GET', 't0' .. '01:k')\" 1 t000:k` (t001's key, built in the "
                     f"script): `{escape_text}`")
        lines.append("")
        print("\n".join(lines))
    finally:
        for d in daemons:
            d.stop()


if __name__ == "__main__":
    main()
