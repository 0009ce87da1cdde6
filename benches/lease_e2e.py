#!/usr/bin/env python3
"""The lease pair as deployed: Tollgate's `LEASE ACQUIRE`/`LEASE RELEASE` against the same two
scripts forwarded by twemproxy and run on Redis directly, each proxy a process of its own, in
interleaved rounds, with the CPU each process spends per call.

`cargo bench --bench lease` runs the daemon inside the bench's process (on a thread of its own), so
its CPU per call is read off a thread and the binary is the bench's build. This runs the release
binaries as `tollgate serve` runs them, so a `--baseline` build can be measured in the same rounds,
which the criterion bench cannot do.

    python3 benches/lease_e2e.py [--pairs N] [--rounds R] [--clients 1,16] [--baseline OLD]... [--pin]

--hop-us N puts Redis behind `tools/delay-relay` (N µs each way, as `benches/cache.py --hop-us`):
every target's calls cross it (Redis direct, twemproxy's server, Tollgate's `redis.address`); only
the set-up (lane users, scripts loaded) goes straight to redis-server.

--same-rights runs the forwarded scripts (twemproxy's and the direct row's, as Redis's `default`
user) with the Redis rights of the daemon's lease lane user, so that Redis checks the same key and
channel patterns behind every target; without it, the forwarded scripts run unconfined.

Per row: calls per second (two calls per pair), and the microseconds of CPU per call of the proxy
(Tollgate: per LEASE call; twemproxy: per forwarded EVALSHA) and of redis-server, from /proc. The
clients are Python threads (`lease_load.py`), the same for every target; with --pin they run on the
first CPUs and the servers on the last, as `e2e.py --pin` places them. Medians of the rounds.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the same provisioning and configs as the end-to-end runner)
from lease_load import lease_pairs, load_scripts  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20000, help="pairs per row, over all clients")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--baseline", action="append", default=[])
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--same-rights", action="store_true",
                        help="run the forwarded scripts with the lease lane's Redis rights (see above)")
    parser.add_argument("--binary", default=os.path.join(e2e.ROOT, "target", "release", "tollgate"))
    parser.add_argument("--hop-us", type=int, default=0,
                        help="Redis behind tools/delay-relay, N µs each way (see above)")
    args = parser.parse_args()
    for tool in ("redis-server", "nutcracker"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: run scripts/setup.sh")
    server_cpus, client_cpus = e2e.cpu_split() if args.pin else (None, None)
    if client_cpus:
        os.sched_setaffinity(0, {int(c) for c in client_cpus.replace("-", ",").split(",")})
    e2e.raise_nofile()
    work = tempfile.mkdtemp(prefix="tollgate-lease-e2e-")
    procs = []
    try:
        redis, redis_sock = e2e.start_redis(work, procs)
        lanes_yaml = e2e.provision_lanes(args.binary, redis_sock, work)
        shas = load_scripts(redis_sock)
        served = e2e.start_hop(work, redis_sock, args.hop_us, procs)  # where the targets reach Redis

        targets = [("redis", redis, served, shas)]
        argv, nut_sock = e2e.nutcracker_argv(work, served)
        nutcracker = subprocess.Popen(argv, preexec_fn=e2e.raise_nofile)
        procs.append(nutcracker)
        e2e.wait_for_socket(nut_sock)
        targets.append(("twemproxy", nutcracker, nut_sock, shas))
        for index, binary in enumerate([args.binary] + args.baseline):
            name = "tollgate" if index == 0 else f"baseline{index if index > 1 else ''}"
            config, sock = e2e.tollgate_config(work, name, served, lanes_yaml,
                                               None if index == 0 else os.path.abspath(binary))
            proc = subprocess.Popen([os.path.abspath(binary), "serve", "--config", config],
                                    preexec_fn=e2e.raise_nofile)
            procs.append(proc)
            e2e.wait_for_socket(sock)
            targets.append((name, proc, sock, None))
        if server_cpus:
            for proc in procs:
                e2e.pin(proc.pid, server_cpus)

        if args.same_rights:
            # Once every target has answered its start-up probe (a GET outside the lease keys).
            confine_default_user(args.binary, redis_sock, work)
        client_counts = [int(c) for c in args.clients.split(",")]
        for _, _, sock, target_shas in targets:
            lease_pairs(sock, 50, target_shas, clients=4)  # warm up: scripts cached, lanes open
            if args.hop_us:
                # One call at a time, each its own write: enough for a lane connection to have
                # measured how far Redis is (crates/lanes/src/turnaround.rs: 1,024 writes).
                lease_pairs(sock, 600, target_shas, clients=1)
        samples = {}
        load = [os.getloadavg()[0]]
        for round_no in range(args.rounds):
            # Rotated each round, so that no target always runs first or after the same one.
            order = targets[round_no % len(targets):] + targets[:round_no % len(targets)]
            for clients in client_counts:
                for name, proc, sock, target_shas in order:
                    watch = [("proxy", proc.pid)] if name != "redis" else []
                    watch.append(("redis", redis.pid))
                    before = {who: e2e.cpu_ns(pid) for who, pid in watch}
                    started = time.monotonic()
                    lease_pairs(sock, max(args.pairs // clients, 1), target_shas, clients=clients)
                    elapsed = time.monotonic() - started
                    calls = 2 * max(args.pairs // clients, 1) * clients
                    cpu = {who: (e2e.cpu_ns(pid) - before[who]) / 1000 / calls for who, pid in watch}
                    samples.setdefault((clients, name), []).append((calls / elapsed, cpu))
            load.append(os.getloadavg()[0])

        names = [name for name, _, _, _ in targets]
        print(f"Command: `python3 benches/lease_e2e.py --pairs {args.pairs} --rounds {args.rounds} "
              f"--clients {args.clients}" + " --baseline <older tollgate>" * len(args.baseline)
              + (" --pin" if args.pin else "") + (" --same-rights" if args.same_rights else "")
              + (f" --hop-us {args.hop_us}" if args.hop_us else "")
              + f"` (load average {min(load):.2f}–{max(load):.2f})")
        print()
        print("| clients | target | calls/s | ÷ twemproxy | ÷ redis | proxy CPU µs/call | "
              "÷ twemproxy's | redis CPU µs/call |")
        print("|---|---|---|---|---|---|---|---|")
        for clients in client_counts:
            median = {}
            for name in names:
                rows = samples[(clients, name)]
                median[name] = (statistics.median(r for r, _ in rows),
                                statistics.median(c.get("proxy", 0.0) for _, c in rows),
                                statistics.median(c["redis"] for _, c in rows))
            for name in names:
                rate, proxy, redis_cpu = median[name]
                proxy_cell = "–" if name == "redis" else f"{proxy:.1f}"
                ratio_cell = "–" if name in ("redis", "twemproxy") else f"{proxy / median['twemproxy'][1]:.2f}"
                print(f"| {clients} | {name} | {rate:,.0f} | {rate / median['twemproxy'][0]:.2f} | "
                      f"{rate / median['redis'][0]:.2f} | {proxy_cell} | {ratio_cell} | {redis_cpu:.1f} |")
    finally:
        e2e.stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


def confine_default_user(binary, redis_sock, work):
    """Gives Redis's `default` user, which twemproxy and the direct row run the scripts as, the
    rights of the daemon's lease lane user (`tollgate redis-acl`): its key, channel and command
    rules, its password left alone. Redis then checks every `redis.call` of a forwarded script
    against the same patterns as the daemon's, so the rows compare the proxies, and the difference
    from a run without this flag is what the lease lane's confinement costs Redis."""
    acl = subprocess.run([binary, "redis-acl", "--passwords", os.path.join(work, "acl")],
                         check=True, capture_output=True, text=True).stdout
    line = next(line for line in acl.splitlines() if '"tollgate-leases"' in line)
    words = [word.strip('"') for word in line.split()]
    rules = [word for word in words[3:] if word[:1] in ("~", "&", "+", "-", "%")]
    subprocess.run(["redis-cli", "-s", redis_sock, "ACL", "SETUSER", "default", "resetkeys",
                    "resetchannels", "-@all", *rules], check=True, capture_output=True, text=True)


if __name__ == "__main__":
    main()
