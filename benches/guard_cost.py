#!/usr/bin/env python3
"""A guard's cost stays with its caller: another client's GET latency while a client pipelines
commands at a spinning guard, against the same latency without the spinner, in one run.

Starts Tollgate (release build, its embedded redis-server, one worker thread) with the repository's
hostile guard in `spin` mode, which spins on any command whose first key is `hostile` and allows the
others. Phase "alone": one client sends `GET fine` one at a time. Phase "spinner": the same, while a
second client keeps pipelines of 64 `GET hostile` in flight. Reports the GET client's p50/p99, the
GETs it completed, and the spinner's refused commands per second.

    python3 benches/guard_cost.py [--seconds S] [--baseline path/to/older/tollgate] [--no-build]
                                  [--spinners N] [--spinner-user NAME]

--baseline runs the same phases against a second binary (an earlier build) after this one's.
--spinners runs N spinning connections instead of one; --spinner-user runs them as another OS user
(a process of its own under that uid; needs root): issue 28's attack, one local user's many
connections against another user's GETs, under the default policy's one principal.
"""

import argparse
import multiprocessing
import os
import pwd
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTILE = os.path.join(ROOT, "policies/modules/target/components/hostile.wasm")
PIPELINE = 64


def command(*words):
    out = [b"*%d\r\n" % len(words)]
    for word in words:
        out.append(b"$%d\r\n%s\r\n" % (len(word), word))
    return b"".join(out)


def read_replies(sock, buffer, count):
    """Reads `count` one-line or bulk replies; returns the rest of the buffer and the replies."""
    replies = []
    while len(replies) < count:
        end = buffer.find(b"\r\n")
        if end < 0:
            chunk = sock.recv(65536)
            if not chunk:
                raise SystemExit("tollgate closed the connection")
            buffer += chunk
            continue
        if buffer.startswith(b"$") and buffer[1:end] != b"-1":
            size = int(buffer[1:end])
            while len(buffer) < end + 2 + size + 2:
                buffer += sock.recv(65536)
            replies.append(buffer[end + 2:end + 2 + size])
            buffer = buffer[end + 2 + size + 2:]
        else:
            replies.append(buffer[:end])
            buffer = buffer[end + 2:]
    return buffer, replies


def connect(path):
    deadline = time.time() + 20
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.sendall(command(b"PING"))
            read_replies(s, b"", 1)
            return s
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def gets(path, seconds):
    """GET round trips for `seconds`; the latencies in seconds."""
    s = connect(path)
    get = command(b"GET", b"fine")
    latencies = []
    buffer = b""
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        start = time.perf_counter()
        s.sendall(get)
        buffer, (reply,) = read_replies(s, buffer, 1)
        latencies.append(time.perf_counter() - start)
        if reply != b"v":
            raise SystemExit(f"GET fine answered {reply!r}")
    s.close()
    return latencies


def spin(path, stopping, refused):
    s = connect(path)
    pipeline = command(b"GET", b"hostile") * PIPELINE
    buffer = b""
    while not stopping.is_set():
        s.sendall(pipeline)
        buffer, replies = read_replies(s, buffer, PIPELINE)
        for reply in replies:
            if not reply.startswith(b"-NOPERM"):
                raise SystemExit(f"a spinning command was answered {reply!r}")
        with refused.get_lock():
            refused.value += len(replies)
    s.close()


def spinners(path, count, user, stopping, refused):
    """`count` spinning connections, as `user` when given (this process's uid otherwise)."""
    if user:
        entry = pwd.getpwnam(user)
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
    threads = [threading.Thread(target=spin, args=(path, stopping, refused)) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def percentile(latencies, p):
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def phases(binary, seconds, count, user):
    work = tempfile.mkdtemp(prefix="tollgate-guard-cost-")
    os.chmod(work, 0o755)
    config = os.path.join(work, "tollgate.yaml")
    with open(config, "w") as conf:
        conf.write(f"runtime_dir: {work}/run\nworker_threads: 1\n"
                   f"listen:\n  resp: {work}/resp.sock\n  http: {work}/http.sock\n  mode: \"0666\"\n"
                   f"policy:\n  modules:\n    - {{ path: {HOSTILE}, config: spin }}\n")
    proc = subprocess.Popen([binary, "serve", "--config", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        resp = os.path.join(work, "resp.sock")
        setup = connect(resp)
        setup.sendall(command(b"SET", b"fine", b"v"))
        read_replies(setup, b"", 1)
        results = {"alone": (gets(resp, seconds), 0.0)}
        stopping, refused = multiprocessing.Event(), multiprocessing.Value("q", 0)
        spinner = multiprocessing.Process(target=spinners,
                                          args=(resp, count, user, stopping, refused))
        spinner.start()
        time.sleep(0.5)
        counted = refused.value
        latencies = gets(resp, seconds)
        rate = (refused.value - counted) / seconds
        stopping.set()
        spinner.join()
        results["spinner"] = (latencies, rate)
        return results
    finally:
        proc.terminate()
        proc.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--baseline")
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--spinners", type=int, default=1)
    parser.add_argument("--spinner-user")
    args = parser.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--bin", "tollgate"], cwd=ROOT, check=True)
    targets = [("this build", os.path.join(ROOT, "target/release/tollgate"))]
    if args.baseline:
        targets.append(("baseline", args.baseline))
    print(f"{'build':<12} {'phase':<8} {'GETs':>7} {'p50':>10} {'p99':>10} {'spinner refused/s':>18}")
    for name, binary in targets:
        for phase, (latencies, rate) in phases(binary, args.seconds, args.spinners,
                                               args.spinner_user).items():
            print(f"{name:<12} {phase:<8} {len(latencies):>7} "
                  f"{percentile(latencies, 0.5) * 1e3:>8.3f}ms {percentile(latencies, 0.99) * 1e3:>8.3f}ms "
                  f"{rate:>18.0f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
