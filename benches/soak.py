#!/usr/bin/env python3
"""Issue 28's soak: every attack of one local user against another user's work, attack off and on,
in one run — the victim's p50 and max latency, and the daemon's peak RSS against
`resp.budgets.total`.

Under the default policy every local uid is the one principal `local`, so a pooled resource shared
per principal is one a single user can take whole. Each attack below runs as a second OS user (the
attacker, `--attacker-user`, a process of its own under that uid); the victim is this script's own
process (root). Each attack gets a fresh daemon (the release `tollgate`, its embedded
redis-server, the default policy, `resp.budgets.total: --total`), so that its VmHWM is its own,
and runs `--rounds` rounds of a phase without the attack ("off") then a phase with it ("on"), each
`--seconds` long, on the same daemon:

  bytes        the attacker's 17 connections each announce a `--frame`-sized SET value and send
               half of it, then stall (together more than the total); the victim GETs a 100 KiB
               value and SETs 1 MiB, in turn.
  watchdogs    the attacker takes 256 `LEASE ACQUIRE … SESSION` leases (each a watchdog the daemon
               renews); the victim acquires and releases a SESSION lease in a loop.
  blocking     the attacker holds 24 `BLPOP soak:jobs 0`; the victim RPUSHes to its own list and
               `BLPOP v 1`s it back (the BLPOP is timed).
  lua-once     the attacker's one 7 s Lua busy loop (`EVAL`, a `while` on `TIME`), which
               `resp.script_time_limit` (1 s by default) stops; the victim GETs.
  lua-loop     the same script sent again as soon as the last one is stopped, for the whole phase.
  spin         the repository's hostile guard module in `spin` mode is loaded (this attack's daemon
               only) and 16 attacker connections keep pipelines of 64 `GET hostile` in flight
               (`guard_cost.spinners`); the victim GETs.
  http-streams the attacker opens 500 `GET /v1/leases/<resource>/holders` streams (10 resources)
               over the HTTP socket and never reads them, then acquires and releases those
               resources with 4 KiB values `--churn-pairs` times (enough for every watch to fill
               its buffers), then holds the streams; the victim GETs over RESP.
  churn        a control: the same acquire/release churn without streams, for the whole phase —
               what another user's merely busy client costs the victim.

The daemon's VmRSS is sampled every 50 ms through every phase (/proc/<pid>/status), and VmHWM is
read at the end; RSS is also read 2 s after the last attacker was killed. The victim's commands
that are refused, time out (`--timeout`) or lose their connection are counted as errors (and
their time counts in the max). The attacker is stopped with SIGKILL, as in the issue.

    python3 benches/soak.py [--seconds S] [--rounds R] [--total SIZE] [--frame SIZE]
                            [--attacks bytes,watchdogs,...] [--attacker-user NAME] [--churn-pairs N]
                            [--binary path/to/tollgate] [--timeout S]

Needs root (to run the attacker under another uid). The attacker user is created when missing
(`useradd --system --no-create-home`). The binary is copied into the run's temporary directory at
the start, so that a build replacing target/release/tollgate meanwhile does not change what is
measured. Builds nothing.
"""

import argparse
import hashlib
import http.client
import json
import multiprocessing
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from e2e import raise_nofile, rss_kib
from guard_cost import HOSTILE, command, percentile, spinners

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024
ATTACKS = ["bytes", "watchdogs", "blocking", "lua-once", "lua-loop", "spin", "http-streams", "churn"]

# What each attack does, as the tables say it.
DESCRIBE = {
    "bytes": "byte total: 17 half-sent {frame} SETs",
    "watchdogs": "watchdogs: 256 SESSION leases",
    "blocking": "blocking lane: 24 × BLPOP … 0",
    "lua-once": "one 7 s Lua loop",
    "lua-loop": "7 s Lua loops back to back",
    "spin": "spinning module, 16 connections",
    "http-streams": "500 unread /holders streams, filled",
    "churn": "control: a busy lease client (acquire/release)",
}


class RespError(bytes):
    """An error reply (`-…`), as its text."""


class Closed(Exception):
    """The daemon closed the connection."""


class Conn:
    """One RESP2 connection with a reader for every reply type the daemon sends in RESP2."""

    def __init__(self, path, timeout=None):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buffer = b""

    def send(self, *words):
        self.sock.sendall(command(*(w if isinstance(w, bytes) else str(w).encode() for w in words)))

    def call(self, *words):
        self.send(*words)
        return self.reply()

    def _line(self):
        while True:
            end = self.buffer.find(b"\r\n")
            if end >= 0:
                line, self.buffer = self.buffer[:end], self.buffer[end + 2:]
                return line
            self._fill()

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise Closed()
        self.buffer += chunk

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return bytes(rest)
        if kind == b"-":
            return RespError(rest)
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self.buffer) < size + 2:
                self._fill()
            value, self.buffer = self.buffer[:size], self.buffer[size + 2:]
            return value
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self.reply() for _ in range(size)]
        raise SystemExit(f"unexpected reply line {line[:80]!r}")

    def close(self):
        self.sock.close()


def outcome(reply):
    """A LEASE reply (RESP2: a flat array of names and values) as a dict of str -> value."""
    if not isinstance(reply, list):
        return {"outcome": reply}
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def connect(path, timeout=None, deadline_s=20.0):
    deadline = time.time() + deadline_s
    while True:
        try:
            conn = Conn(path, timeout)
            if conn.call("PING") == b"PONG":
                return conn
            conn.close()
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"{path} did not answer PING within {deadline_s}s")
        time.sleep(0.05)


def parse_size(text):
    units = {"kib": 1024, "mib": MIB, "gib": 1024 * MIB, "b": 1}
    lower = text.strip().lower()
    for unit, factor in units.items():
        if lower.endswith(unit):
            return int(float(lower[: -len(unit)]) * factor)
    return int(lower)


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


class Sampler:
    """VmRSS of `pid` every `interval` seconds in a thread; `peak` is the largest seen (KiB)."""

    def __init__(self, pid, interval=0.05):
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stopping.is_set():
            try:
                self.peak = max(self.peak, rss_kib(self.pid))
            except FileNotFoundError:
                return
            self.stopping.wait(self.interval)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()
        self.thread.join()


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def held_by(http_sock, uid):
    """What the daemon says `uid` holds (`GET /v1/principals`, which root may read), in words."""
    try:
        conn = UnixHTTPConnection(http_sock)
        conn.request("GET", "/v1/principals")
        body = json.loads(conn.getresponse().read())
        conn.close()
    except (OSError, ValueError) as error:
        return f"(/v1/principals: {error})"
    rows = [row for row in body.get("principals", []) if row.get("uid") == uid]
    if not rows:
        return "(no row)"
    def words(row):
        said = [f"{row['resp_sessions']} RESP sessions"]
        if row["bytes_held"]:
            said.append(f"{row['bytes_held'] / MIB:.1f} MiB held")
        if row["watchdogs"]:
            said.append(f"{row['watchdogs']} watchdogs")
        if row["watches"]:
            said.append(f"{row['watches']} watches")
        said.append(f"admission {row['admission_ms']:.0f} ms, waited {row['admission_waited_ms']:.0f} ms")
        return ", ".join(said)
    return "; ".join(words(row) for row in rows)


# ---------------------------------------------------------------------------------------------
# The attacker: a process of its own, under the attacker's uid. Each attack sets `ready` once it
# holds what it takes, counts what it got in `counters`, and returns what it holds (connections),
# which stay open until the process is killed.


def become(user):
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


def attacker(kind, work, user, args, ready, stop, counters):
    become(user)
    resp = os.path.join(work, "resp.sock")
    held = ATTACKERS[kind](resp, os.path.join(work, "http.sock"), args, ready, stop, counters)
    stop.wait()
    return held


def attack_bytes(resp, _http, args, ready, _stop, counters):
    """17 connections each announce `args.frame` bytes of SET value, send half, and stall.
    counters[0]: bytes the daemon took from them."""
    frame = args.frame

    def upload():
        s = socket.socket(socket.AF_UNIX)
        s.connect(resp)
        s.sendall(b"*3\r\n$3\r\nSET\r\n$11\r\nsoak:upload\r\n$%d\r\n" % frame)
        chunk = b"x" * (256 * 1024)
        for _ in range(frame // 2 // len(chunk)):
            try:
                s.sendall(chunk)
            except OSError:
                break
            with counters[0].get_lock():
                counters[0].value += len(chunk)
        threading.Event().wait()  # stall, holding the connection

    for _ in range(17):
        threading.Thread(target=upload, daemon=True).start()
    # Ready once the daemon has stopped taking more (or all of it was sent).
    last, still = -1, 0
    while still < 5:
        time.sleep(0.2)
        now = counters[0].value
        still = still + 1 if now == last else 0
        last = now
    ready.set()


def attack_watchdogs(resp, _http, _args, ready, _stop, counters):
    """256 SESSION leases on one connection, then a 257th to see the share full.
    counters[0]: acquired, counters[1]: refused, counters[2]: 1 when the 257th was refused."""
    conn = connect(resp)
    for i in range(256):
        got = outcome(conn.call("LEASE", "ACQUIRE", f"soak:attacker:{i}", "10000", "SESSION"))
        counters[0 if got.get("outcome") == b"acquired" else 1].value += 1
    probe = outcome(conn.call("LEASE", "ACQUIRE", "soak:attacker:probe", "10000", "SESSION"))
    counters[2].value = int(probe.get("outcome") == b"too_many_watchdogs")
    ready.set()
    return conn


def attack_blocking(resp, _http, _args, ready, _stop, counters):
    """24 connections in `BLPOP soak:jobs 0`, then a 25th `BLPOP soak:jobs 1` to see the share
    full. counters[0]: sent, counters[1]: answered at once (not blocked), counters[2]: 1 when the
    25th was refused."""
    conns = []
    for _ in range(24):
        conn = connect(resp)
        conn.send("BLPOP", "soak:jobs", "0")
        conns.append(conn)
        counters[0].value += 1
    time.sleep(0.5)
    for conn in conns:
        conn.sock.setblocking(False)
        try:
            if conn.sock.recv(1 << 16):
                counters[1].value += 1
        except BlockingIOError:
            pass
    probe = connect(resp, timeout=10)
    counters[2].value = int(isinstance(probe.call("BLPOP", "soak:jobs", "1"), RespError))
    ready.set()
    return conns + [probe]


LUA = ("local start = tonumber(redis.call('TIME')[1]) "
       "while tonumber(redis.call('TIME')[1]) - start < 7 do end return 1")


def attack_lua(resp, loop, ready, stop, counters):
    """EVAL of a 7 s busy loop; again as soon as it is answered when `loop`.
    counters[0]: scripts sent, counters[1]: stopped at the limit (an error naming it),
    counters[2]: refused unsent (`BUSY`: the user's script cooldown)."""
    conn = connect(resp)
    while True:
        conn.send("EVAL", LUA, "0")
        counters[0].value += 1
        if not ready.is_set():
            time.sleep(0.05)  # running in Redis by now
            ready.set()
        reply = conn.reply()
        if isinstance(reply, RespError):
            refused = reply.startswith(b"BUSY")
            counters[2 if refused else 1].value += 1
        if not loop or stop.is_set():
            return conn


def attack_lua_once(resp, _http, _args, ready, stop, counters):
    return attack_lua(resp, False, ready, stop, counters)


def attack_lua_loop(resp, _http, _args, ready, stop, counters):
    return attack_lua(resp, True, ready, stop, counters)


def attack_spin(resp, _http, _args, ready, stop, counters):
    """guard_cost.spinners' 16 connections (already under the attacker's uid).
    counters[0]: the spinners' commands refused by the module."""
    ready.set()
    spinners(resp, 16, None, stop, counters[0])


def attack_http_streams(resp, http, args, ready, stop, counters, streams_too=True):
    """500 never-read holder streams over 10 resources, then `args.churn_pairs` acquire/release
    pairs of those resources with 4 KiB values (enough to fill every watch's buffers, 64 events
    and 64 messages), then holds it all; without `streams_too` (the control), the churn alone and
    until killed. counters[0]: streams answered 200, counters[1]: refused (any other status),
    counters[2]: acquire/release pairs."""
    resources = [f"soak:watched:{i}" for i in range(10)]
    streams = []
    for i in range(500 if streams_too else 0):
        s = socket.socket(socket.AF_UNIX)
        s.connect(http)
        s.sendall(f"GET /v1/leases/{resources[i % 10]}/holders HTTP/1.1\r\nHost: localhost\r\n\r\n"
                  .encode())
        s.settimeout(5)
        try:
            head = s.recv(12)  # "HTTP/1.1 200": the status line, and nothing of the body
        except OSError:
            head = b""
        counters[0 if head[9:12] == b"200" else 1].value += 1
        streams.append(s)
    if not streams_too:
        ready.set()
    conn = connect(resp)
    value = b"v" * 4096
    while not stop.is_set():
        if streams_too and counters[2].value >= args.churn_pairs:
            ready.set()
            return streams, conn
        for resource in resources:
            got = outcome(conn.call("LEASE", "ACQUIRE", resource, "10000", "VALUE", value))
            if got.get("outcome") == b"acquired":
                conn.call("LEASE", "RELEASE", resource, "OWNER", got["owner"], "OP", got["operation_id"])
                counters[2].value += 1


def attack_churn(resp, http, args, ready, stop, counters):
    return attack_http_streams(resp, http, args, ready, stop, counters, streams_too=False)


ATTACKERS = {
    "bytes": attack_bytes,
    "watchdogs": attack_watchdogs,
    "blocking": attack_blocking,
    "lua-once": attack_lua_once,
    "lua-loop": attack_lua_loop,
    "spin": attack_spin,
    "http-streams": attack_http_streams,
    "churn": attack_churn,
}


def got_summary(kind, counters, args):
    """What the attacker held, from its counters, in words."""
    c = [counter.value for counter in counters]
    if kind == "bytes":
        return f"{c[0] / MIB:.1f} MiB read of {17 * (args.frame // 2) / MIB:.0f} MiB sent"
    if kind == "watchdogs":
        return f"{c[0]} acquired, {c[1]} refused; the 257th {'refused' if c[2] else 'acquired'}"
    if kind == "blocking":
        return f"{c[0] - c[1]} blocked, {c[1]} answered at once; a 25th {'refused' if c[2] else 'run'}"
    if kind.startswith("lua"):
        return f"{c[0]:,} scripts sent, {c[1]} stopped at the limit, {c[2]:,} refused (cooldown)"
    if kind == "spin":
        return f"{c[0]:,} commands refused by the module"
    if kind == "churn":
        return f"{c[2]:,} acquire/release pairs"
    return f"{c[0]} streams opened, {c[1]} refused; {c[2]:,} acquire/release pairs"


# ---------------------------------------------------------------------------------------------
# The victim: this process (root). Each loop returns {op: [(seconds, ok)]}.


class Victim:
    """A connection that is opened again after an error that closed it."""

    def __init__(self, path, timeout):
        self.path, self.timeout = path, timeout
        self.conn = connect(path, timeout)
        self.samples = {}

    def timed(self, op, *words, check=None):
        start = time.perf_counter()
        try:
            reply = self.conn.call(*words)
            ok = not isinstance(reply, RespError) and (check is None or check(reply))
        except (OSError, Closed):
            reply, ok = None, False
            self.conn.close()
            self.conn = connect(self.path, self.timeout)
        self.samples.setdefault(op, []).append((time.perf_counter() - start, ok))
        if not ok and len([1 for _, good in self.samples[op] if not good]) <= 3:
            print(f"    victim {op}: {str(reply)[:160]}", file=sys.stderr)
        return reply, ok


def victim_get(v):
    v.timed("GET", "GET", "fine", check=lambda r: r == b"v")


def victim_bytes(v):
    v.timed("GET 100 KiB", "GET", "shared:100k", check=lambda r: r is not None and len(r) == 100 * 1024)
    v.timed("SET 1 MiB", "SET", "victim:1m", b"v" * MIB, check=lambda r: r == b"OK")


def victim_lease(v):
    reply, ok = v.timed("LEASE ACQUIRE … SESSION", "LEASE", "ACQUIRE", "soak:victim", "10000", "SESSION",
                        check=lambda r: outcome(r).get("outcome") == b"acquired")
    if ok:
        got = outcome(reply)
        v.conn.call("LEASE", "RELEASE", "soak:victim", "OWNER", got["owner"], "OP", got["operation_id"])


def victim_blpop(v):
    v.conn.call("RPUSH", "v", "x")
    v.timed("BLPOP v 1", "BLPOP", "v", "1", check=lambda r: r == [b"v", b"x"])


VICTIMS = {
    "bytes": victim_bytes,
    "watchdogs": victim_lease,
    "blocking": victim_blpop,
    "lua-once": victim_get,
    "lua-loop": victim_get,
    "spin": victim_get,
    "http-streams": victim_get,
    "churn": victim_get,
}


def setup(resp):
    conn = connect(resp)
    conn.call("SET", "fine", "v")
    conn.call("SET", "shared:100k", b"v" * (100 * 1024))
    conn.close()


# ---------------------------------------------------------------------------------------------


def start_daemon(binary, work, kind, total):
    """A fresh daemon for one attack: its own temporary directory (reachable by the attacker),
    the embedded redis-server, the default policy; the hostile spin module for `spin` only."""
    os.chmod(work, 0o755)
    module = f"policy:\n  modules:\n    - {{ path: {HOSTILE}, config: spin }}\n" if kind == "spin" else ""
    config = os.path.join(work, "tollgate.yaml")
    with open(config, "w") as conf:
        conf.write(f"runtime_dir: {work}/run\n"
                   f"listen:\n  resp: {work}/resp.sock\n  http: {work}/http.sock\n  mode: \"0666\"\n"
                   f"logging:\n  level: warn\n"
                   f"resp:\n  budgets:\n    total: {total}\n" + module)
    with open(os.path.join(work, "tollgate.log"), "w") as log:
        proc = subprocess.Popen([binary, "serve", "--config", config], stdout=log, stderr=log,
                                preexec_fn=raise_nofile)
    resp = os.path.join(work, "resp.sock")
    connect(resp, deadline_s=30).close()
    return proc, resp


def run_attack(kind, binary, args):
    work = tempfile.mkdtemp(prefix=f"tollgate-soak-{kind}-")
    proc, resp = start_daemon(binary, work, kind, args.total_text)
    ctx = multiprocessing.get_context("fork")
    result = {"phases": [], "got": [], "held": [], "rounds": {}}
    try:
        setup(resp)
        victim = Victim(resp, args.timeout)
        loop = VICTIMS[kind]
        # Warm up: connections, lanes, pages touched once.
        until = time.perf_counter() + 1.0
        while time.perf_counter() < until:
            loop(victim)
        totals = {}  # (op, "off" | "on") -> [(seconds, ok)] over every round
        result["idle_kib"] = rss_kib(proc.pid)
        for round_no in range(args.rounds):
            for phase in ("off", "on"):
                child = None
                sampler = Sampler(proc.pid).start()  # the attacker's set-up counts too
                try:
                    if phase == "on":
                        ready, stop = ctx.Event(), ctx.Event()
                        counters = [ctx.Value("q", 0) for _ in range(3)]
                        child = ctx.Process(target=attacker,
                                            args=(kind, work, args.attacker_user, args, ready, stop, counters))
                        child.start()
                        if not ready.wait(60):
                            raise SystemExit(f"{kind}: the attacker was not ready within 60 s")
                        if kind != "lua-once":
                            time.sleep(0.5)
                    victim.samples = {}
                    until = time.perf_counter() + args.seconds
                    halfway = until - args.seconds / 2 if child is not None else None
                    while time.perf_counter() < until:
                        loop(victim)
                        if halfway is not None and time.perf_counter() >= halfway:
                            halfway = None  # once, halfway through; not counted in the victim's ops
                            result["held"].append(held_by(os.path.join(work, "http.sock"), args.attacker_uid))
                    if child is not None:
                        result["got"].append(got_summary(kind, counters, args))
                finally:
                    if child is not None:
                        child.kill()
                        child.join()
                    sampler.stop()
                samples = victim.samples
                for op, values in samples.items():
                    totals.setdefault((op, phase), []).extend(values)
                    result["rounds"].setdefault((op, phase), []).append(
                        percentile([seconds for seconds, _ in values], 0.5))
                result["phases"].append((phase, sampler.peak, samples))
                line = "; ".join(f"{op}: {len(v)} ops, p50 {percentile([s for s, _ in v], 0.5) * 1e3:.3f} ms, "
                                 f"max {max(s for s, _ in v) * 1e3:.1f} ms, {sum(1 for _, ok in v if not ok)} errors"
                                 for op, v in samples.items())
                print(f"  {kind} round {round_no + 1} {phase}: {line}; peak RSS {sampler.peak / 1024:.1f} MiB"
                      + (f"; attacker: {result['got'][-1]}; held halfway: {result['held'][-1] if result['held'] else '?'}"
                         if child is not None else ""), file=sys.stderr)
        time.sleep(2)
        result["after_kib"] = rss_kib(proc.pid)
        result["hwm_kib"] = vm_hwm_kib(proc.pid)
        result["samples"] = totals
        victim.conn.close()
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def ensure_user(name):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True)
        print(f"created the system user {name}", file=sys.stderr)
        return pwd.getpwnam(name)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=2, help="off/on rounds per attack")
    parser.add_argument("--total", default="64MiB", help="resp.budgets.total")
    parser.add_argument("--frame", default="8MiB",
                        help="the byte attack's announced SET size (17 connections send half each)")
    parser.add_argument("--churn-pairs", type=int, default=2000,
                        help="acquire/release pairs that fill the http-streams attack's watches")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--attacker-user", default="tollgate-soak")
    parser.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "tollgate"))
    parser.add_argument("--timeout", type=float, default=10.0, help="the victim's wait for one reply")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the attacker runs under another uid")
    kinds = [kind.strip() for kind in args.attacks.split(",") if kind.strip()]
    for kind in kinds:
        if kind not in ATTACKERS:
            raise SystemExit(f"unknown attack {kind}; one of {', '.join(ATTACKS)}")
    args.total_text, args.total_bytes, args.frame = args.total, parse_size(args.total), parse_size(args.frame)
    entry = ensure_user(args.attacker_user)
    args.attacker_uid = entry.pw_uid
    raise_nofile()

    keep = tempfile.mkdtemp(prefix="tollgate-soak-bin-")
    os.chmod(keep, 0o755)
    binary = os.path.join(keep, "tollgate")
    shutil.copy2(args.binary, binary)
    with open(binary, "rb") as image:
        digest = hashlib.sha256(image.read()).hexdigest()[:12]
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(args.binary)))
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()

    load_before = os.getloadavg()
    results = {}
    try:
        for kind in kinds:
            print(f"{kind} …", file=sys.stderr)
            results[kind] = run_attack(kind, binary, args)
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    load_after = os.getloadavg()
    print(report(args, kinds, results, entry, digest, built, head, load_before, load_after))


def first_round(texts):
    """One round's words for what the attacker did, or the first round's when rounds differ."""
    distinct = list(dict.fromkeys(texts))
    return distinct[0] if len(distinct) == 1 else f"{distinct[0]} (round 1)" if distinct else ""


def report(args, kinds, results, entry, digest, built, head, load_before, load_after):
    per_uid = args.total_bytes // 4
    lines = [
        f"Command: `python3 benches/soak.py --seconds {args.seconds:g} --rounds {args.rounds} --total {args.total_text} "
        f"--frame {args.frame // MIB}MiB --attacker-user {args.attacker_user}` ({time.strftime('%Y-%m-%d')}; "
        f"release binary built {built}, sha256 {digest}…, HEAD {head} when run; attacker uid {entry.pw_uid}, victim uid "
        f"{os.geteuid()}, both the default policy's principal `local`; `resp.budgets.total: {args.total_text}` "
        f"(per-uid share: a quarter, {per_uid / MIB:.0f} MiB), everything else default; "
        f"{args.rounds} × ({args.seconds:g} s off, {args.seconds:g} s on) per attack, a fresh daemon per attack; "
        f"{os.cpu_count()} cores; load average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end).",
        "",
        "**The victim's latency** (ms; p50 and max over all its ops of the phase kind, every round together, "
        "so a round in which it completed more ops weighs more; each round's ratio beside it; errors: refused, "
        f"timed out after {args.timeout:g} s, or disconnected)",
        "",
        "| attack | the attacker got | victim's op | ops off / on | p50 off | p50 on | p50 on/off | each round's "
        "p50 on/off | max off | max on | errors off / on | p50 within 2× |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in kinds:
        result = results[kind]
        ops = []
        for op, phase in result["samples"]:
            if op not in ops:
                ops.append(op)
        for op in ops:
            off = result["samples"].get((op, "off"), [])
            on = result["samples"].get((op, "on"), [])
            p50 = [percentile([s for s, _ in values], 0.5) * 1e3 if values else float("nan") for values in (off, on)]
            top = [max(s for s, _ in values) * 1e3 if values else float("nan") for values in (off, on)]
            errors = [sum(1 for _, ok in values if not ok) for values in (off, on)]
            ratio = p50[1] / p50[0]
            each = ", ".join(f"{on_p50 / off_p50:.2f}" for off_p50, on_p50 in
                             zip(result["rounds"].get((op, "off"), []), result["rounds"].get((op, "on"), [])))
            lines.append(
                f"| {DESCRIBE[kind].format(frame=f'{args.frame // MIB} MiB')} | {first_round(result['got'])} "
                f"| {op} | {len(off):,} / {len(on):,} | {p50[0]:.3f} | {p50[1]:.3f} | {ratio:.2f} | {each} | {top[0]:.1f} "
                f"| {top[1]:.1f} | {errors[0]} / {errors[1]} | {'yes' if ratio <= 2 else '**no**'} |")
    lines += [
        "",
        "**The daemon's RSS** (MiB; sampled every 50 ms; idle: after the warm-up, before any attack; "
        "first off: the peak of the first phase without the attack (later ones carry what the attack left); "
        "VmHWM: the process's peak over its whole life)",
        "",
        f"| attack | idle | peak, first off | peak on | VmHWM | VmHWM − idle | 2 s after the last attack | "
        f"VmHWM ≤ total ({args.total_bytes / MIB:.0f}) + idle |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in kinds:
        result = results[kind]
        first_off = result["phases"][0][1] / 1024
        peak_on = max([p for ph, p, _ in result["phases"] if ph == "on"] or [0]) / 1024
        idle, hwm = result["idle_kib"] / 1024, result["hwm_kib"] / 1024
        within = hwm <= args.total_bytes / MIB + idle
        lines.append(f"| {DESCRIBE[kind].format(frame=f'{args.frame // MIB} MiB')} | {idle:.1f} | {first_off:.1f} "
                     f"| {peak_on:.1f} | {hwm:.1f} | {hwm - idle:+.1f} | {result['after_kib'] / 1024:.1f} "
                     f"| {'yes' if within else '**no**'} |")
    lines += [
        "",
        "**What the attacker's uid held halfway through each attack phase** (`GET /v1/principals`)",
        "",
        "| attack | held |",
        "|---|---|",
    ]
    for kind in kinds:
        lines.append(f"| {DESCRIBE[kind].format(frame=f'{args.frame // MIB} MiB')} | "
                     f"{first_round(results[kind]['held'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
