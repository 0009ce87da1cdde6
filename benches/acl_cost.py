#!/usr/bin/env python3
"""What the client lanes' ACL key patterns cost Redis itself: redis-benchmark against one
redis-server as three users, interleaved round by round in the same run: `default` (no rules at
all), `allkeys` (the REGULAR lane's command rules with `~* &*`, as the lanes had before the
reserved keyspace), and the REGULAR lane's user (`tollgate redis-acl`: the complement of the
reserved prefix). Keys like `key:…` leave the prefix at the first byte; keys like `tollgatex…`
walk every pattern.

    python3 benches/acl_cost.py [--requests 200000] [--rounds 5] [--pipeline 16]

Prints, for each test and both users, the median requests per second and the median CPU time
redis-server spent per request (utime + stime from /proc, so less at the mercy of other load on
the machine than throughput), and the ratios lane / default.
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

from e2e import private_acl  # benches/ is on sys.path when run as a script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TESTS = [
    ("SET key:", ["SET", "key:__rand_int__", "v"]),
    ("GET key:", ["GET", "key:__rand_int__"]),
    ("MSET 10 key:", ["MSET"] + [x for i in range(10) for x in (f"key:{i}:__rand_int__", "v")]),
    ("SET tollgatex", ["SET", "tollgatex:__rand_int__", "v"]),
    ("GET tollgatex", ["GET", "tollgatex:__rand_int__"]),
    ("MSET 10 tollgatex", ["MSET"] + [x for i in range(10) for x in (f"tollgatex{i}:__rand_int__", "v")]),
]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime, fields 14 and 15 of stat(5), counted from after the command name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(sock, pid, user, requests, pipeline, command):
    """(requests per second, redis-server CPU microseconds per request)"""
    before = cpu_seconds(pid)
    per_second = rps(sock, user, requests, pipeline, command)
    return per_second, (cpu_seconds(pid) - before) * 1e6 / requests


def rps(sock, user, requests, pipeline, command):
    auth = ["--user", user[0], "-a", user[1]] if user else []
    out = subprocess.run(
        ["redis-benchmark", "-s", sock, "-n", str(requests), "-P", str(pipeline), "-c", "8", "--csv",
         *auth, *command],
        check=True, capture_output=True, text=True).stdout
    # "test","rps",...: the last line holds the figures.
    return float(out.strip().splitlines()[-1].split(",")[1].strip('"'))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pipeline", type=int, default=16)
    parser.add_argument("--tollgate", default=os.path.join(ROOT, "target", "release", "tollgate"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="tollgate-acl-")
    sock = os.path.join(work, "redis.sock")
    redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock, "--save", "",
                              "--appendonly", "no", "--dir", work, "--logfile", os.path.join(work, "redis.log")])
    try:
        while not os.path.exists(sock):
            time.sleep(0.01)
        passwords = os.path.join(work, "acl")
        acl = subprocess.run([args.tollgate, "redis-acl", "--passwords", passwords],
                             check=True, capture_output=True, text=True).stdout
        subprocess.run(["redis-cli", "-s", sock], input=private_acl(acl), check=True, capture_output=True, text=True)
        with open(os.path.join(passwords, "lane-regular.password")) as f:
            lane_user = ("tollgate-regular", f.readline().strip())
        subprocess.run(["redis-cli", "-s", sock, "ACL", "SETUSER", "allkeys", "on", ">allkeys", "~*", "&*",
                        "+@all", "-@scripting", "-@admin", "-@dangerous"], check=True, capture_output=True)
        users = (("default", None), ("allkeys", ("allkeys", "allkeys")), ("lane", lane_user))
        figures = {name: {who: [] for who, _ in users} for name, _ in TESTS}
        for _ in range(args.rounds):
            for name, command in TESTS:
                for who, user in users:
                    figures[name][who].append(run(sock, redis.pid, user, args.requests, args.pipeline, command))
        print(f"{args.rounds} rounds of {args.requests} requests, -P {args.pipeline}, medians;"
              " redis-server CPU µs per request (requests/s)")
        print(f"{'test':<20} {'default':>16} {'allkeys':>16} {'lane user':>16} {'lane/allkeys':>13}")
        for name, _ in TESTS:
            row = {who: [statistics.median(f[i] for f in figures[name][who]) for i in (0, 1)]
                   for who, _ in users}
            cells = " ".join(f"{row[who][1]:>6.3f} ({row[who][0] / 1000:>5.0f}k)" for who, _ in users)
            print(f"{name:<20} {cells} {row['lane'][1] / row['allkeys'][1]:>13.3f}")
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
