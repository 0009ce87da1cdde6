#!/usr/bin/env python3
"""Pipelined transactions end to end: one client writes MULTI, N commands and EXEC in one write and
reads every reply, again and again; Redis directly and through Tollgate (and every --baseline
build), optionally with Redis behind a simulated network hop. The figure is the time a whole
transaction takes (p50 and mean over the repetitions, median over the rounds), which counts the
round trips to Redis it costs: one direct, two through a Tollgate that writes queued commands
ahead (MULTI's, then the rest), one per command for a build that awaited each `QUEUED`.

    python3 benches/transactions.py [--commands 10] [--reps 500] [--rounds 3] [--hop-us 250]
                                    [--binary PATH] [--baseline OLD]...

--hop-us N puts Redis behind `tools/delay-relay` (N µs each way, as `benches/cache.py --hop-us`);
every target crosses it. Twemproxy does not serve MULTI, so it is not a target here.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the same redis-server, lane users and configs)


def encode(*args):
    out = f"*{len(args)}\r\n"
    for arg in args:
        arg = str(arg)
        out += f"${len(arg.encode())}\r\n{arg}\r\n"
    return out.encode()


def replies_end(buf, count):
    """Where `count` whole replies end in `buf` (simple lines, or arrays of simple lines: what
    MULTI, SET and EXEC answer), or None until they have all arrived."""
    pos = 0
    for _ in range(count):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        line, pos = buf[pos:end], end + 2
        if line[:1] == b"*" and line != b"*-1":
            for _ in range(int(line[1:])):
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    return None
                pos = end + 2
    return pos


def transactions(path, commands, reps):
    """Times `reps` pipelined transactions of `commands` SETs on a new connection to `path`."""
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    payload = encode("MULTI") + b"".join(encode("SET", f"tx:{i}", "v") for i in range(commands)) + encode("EXEC")
    times, buf = [], b""
    for _ in range(reps):
        started = time.perf_counter()
        client.sendall(payload)
        while (end := replies_end(buf, commands + 2)) is None:
            data = client.recv(65536)
            if not data:
                raise SystemExit(f"{path} closed the connection")
            buf += data
        if b"EXECABORT" in buf[:end] or b"-ERR" in buf[:end]:
            raise SystemExit(f"{path}: a transaction failed: {buf[:end]!r}")
        buf = buf[end:]
        times.append(time.perf_counter() - started)
    client.close()
    return statistics.median(times) * 1000, statistics.mean(times) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=10)
    parser.add_argument("--reps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hop-us", type=int, default=0)
    parser.add_argument("--binary", default=os.path.join(e2e.ROOT, "target", "release", "tollgate"))
    parser.add_argument("--baseline", action="append", default=[], metavar="OLD")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="tollgate-tx-")
    procs = []
    try:
        _, redis_sock = e2e.start_redis(work, procs)
        upstream = e2e.start_hop(work, redis_sock, args.hop_us, procs)
        lanes = e2e.provision_lanes(args.binary, redis_sock, work)
        targets = {"redis": upstream}
        builds = [("tollgate", args.binary, None)] + [
            (f"baseline{i or ''}", path, path) for i, path in enumerate(args.baseline)]
        for name, binary, older in builds:
            config, sock = e2e.tollgate_config(work, name, upstream, lanes, older)
            procs.append(subprocess.Popen([binary, "serve", "--config", config], stderr=subprocess.DEVNULL))
            e2e.wait_for_socket(sock)
            targets[name] = sock
        runs = {name: [] for name in targets}
        for round_no in range(args.rounds):
            order = list(targets) if round_no % 2 == 0 else list(reversed(targets))
            for name in order:
                runs[name].append(transactions(targets[name], args.commands, args.reps))
        hop = f", Redis behind tools/delay-relay ({args.hop_us} µs each way)" if args.hop_us else ""
        print(f"Command: `python3 benches/transactions.py --commands {args.commands} --reps {args.reps} "
              f"--rounds {args.rounds}{f' --hop-us {args.hop_us}' if args.hop_us else ''}"
              f"{' --baseline <older tollgate>' * len(args.baseline)}` (one client, MULTI + "
              f"{args.commands} SETs + EXEC in one write{hop}; load average {os.getloadavg()[0]:.2f})")
        print()
        print("| target | p50 ms | mean ms | p50 / redis |")
        print("|---|---|---|---|")
        direct = statistics.median(p50 for p50, _ in runs["redis"])
        for name, values in runs.items():
            p50 = statistics.median(v[0] for v in values)
            mean = statistics.median(v[1] for v in values)
            print(f"| {name} | {p50:.3f} | {mean:.3f} | {p50 / direct:.2f} |")
    finally:
        e2e.stop_all(procs)


if __name__ == "__main__":
    main()
