#!/usr/bin/env python3
"""What the client lanes' ACL key patterns cost Redis itself: redis-benchmark against one
redis-server, as the `default` user (no key patterns) and as the REGULAR lane's user (the
complement of the reserved prefix, `tollgate redis-acl`), interleaved round by round in the same
run. Keys like `key:…` leave the prefix at the first byte; keys like `tollgatex…` walk every pattern.

    python3 benches/acl_cost.py [--requests 200000] [--rounds 5] [--pipeline 16]

Prints the median requests per second of each test for both users and their ratio (lane / default).
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TESTS = [
    ("SET key:", ["SET", "key:__rand_int__", "v"]),
    ("GET key:", ["GET", "key:__rand_int__"]),
    ("MSET 10 key:", ["MSET"] + [x for i in range(10) for x in (f"key:{i}:__rand_int__", "v")]),
    ("SET tollgatex", ["SET", "tollgatex:__rand_int__", "v"]),
    ("GET tollgatex", ["GET", "tollgatex:__rand_int__"]),
    ("MSET 10 tollgatex", ["MSET"] + [x for i in range(10) for x in (f"tollgatex{i}:__rand_int__", "v")]),
]


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
        subprocess.run(["redis-cli", "-s", sock], input=acl, check=True, capture_output=True, text=True)
        with open(os.path.join(passwords, "lane-regular.password")) as f:
            lane_user = ("tollgate-regular", f.readline().strip())
        figures = {name: {"default": [], "lane": []} for name, _ in TESTS}
        for _ in range(args.rounds):
            for name, command in TESTS:
                figures[name]["default"].append(rps(sock, None, args.requests, args.pipeline, command))
                figures[name]["lane"].append(rps(sock, lane_user, args.requests, args.pipeline, command))
        print(f"{args.rounds} rounds of {args.requests} requests, -P {args.pipeline}, medians (requests/s)")
        print(f"{'test':<20} {'default':>12} {'lane user':>12} {'ratio':>7}")
        for name, _ in TESTS:
            default = statistics.median(figures[name]["default"])
            lane = statistics.median(figures[name]["lane"])
            print(f"{name:<20} {default:>12.0f} {lane:>12.0f} {lane / default:>7.3f}")
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
