#!/usr/bin/env python3
"""Bull 4 and bee-queue, as real apps, directly against redis-server and through Tollgate.

Installs the two job-queue libraries (pinned) with npm into a temporary directory, then runs
job_queues/app.js for each library, twice:

- direct:   on a plain redis-server's Unix socket;
- tollgate: on `tollgate serve`'s RESP socket, set up as tools/compat/redis_py.py sets it up
            (allow-all policy, an external redis-server with the lane users `tollgate redis-acl`
            prints).

Each run starts a worker first (several handlers at once, so its BRPOPLPUSH loops are pipelined
on one blocking connection, as both libraries do), then a producer that adds the jobs one by
one; every fifth job's first attempt fails and is retried after a fixed 300 ms backoff. A run
passes when every job ran exactly as often as it should (once, twice for those that fail first),
succeeded once, was retried no sooner than the backoff and within RETRY_WINDOW_MS, and the queue
holds nothing waiting, active or delayed at the end. Needs node and npm (not a CI test: CI has neither guaranteed).

    python3 tools/compat/job_queues.py [--tollgate target/debug/tollgate] [--jobs 500]
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import redis_py  # noqa: E402  (the same redis-server and Tollgate set-up)

PACKAGES = ["bull@4.16.5", "bee-queue@2.0.0"]
LIBRARIES = ["bull", "bee"]
APP = pathlib.Path(__file__).resolve().parent / "job_queues" / "app.js"
# The backoff. A retry starts no sooner after its failed attempt ended, and within the window: both
# libraries put a retried job at the back of the waiting list, so the gap also holds the jobs
# queued ahead of it (bee-queue also gathers delayed jobs for up to 1 s, `delayedDebounce`).
BACKOFF_MS = 300
RETRY_WINDOW_MS = 10000
WORKER_TIMEOUT_S = 300


def install(work):
    log = work / "npm.log"
    with open(log, "w") as out:
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(work)]
                       + PACKAGES, stdout=out, stderr=subprocess.STDOUT, check=True)
    shutil.copy(APP, work / "app.js")


def run(work, lib, socket, queue, jobs, concurrency):
    """The worker's JSON result, the producer's, and the worker's stderr."""
    node = ["node", str(work / "app.js"), lib]
    errors = open(work / f"{queue}.worker.err", "w+")
    worker = subprocess.Popen(node + ["worker", str(socket), queue, str(jobs), str(concurrency)],
                              cwd=work, stdout=subprocess.PIPE, stderr=errors, text=True,
                              env=dict(os.environ,
                                       WORKER_TIMEOUT_MS=str(WORKER_TIMEOUT_S * 1000)))
    redis_py.wait_for(lambda: "worker ready" in pathlib.Path(errors.name).read_text()
                      or worker.poll() is not None, f"the {lib} worker")
    # Let the worker's loops reach BRPOPLPUSH on the empty queue before any job exists.
    time.sleep(1)
    producer = subprocess.run(node + ["producer", str(socket), queue, str(jobs)], cwd=work,
                              capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    try:
        out, _ = worker.communicate(timeout=WORKER_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        worker.kill()
        out, _ = worker.communicate()
    errors.seek(0)
    return last_json(out), last_json(producer.stdout), errors.read() + producer.stderr


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def verdict(worker, producer, jobs, states=("waiting", "active", "delayed", "failed")):
    """The reasons the run fails; empty when it passes. `states`: the queue's states that must be
    empty at the end (BullMQ has more than Bull and bee-queue)."""
    if worker is None or producer is None:
        return ["no result (see the worker's stderr)"]
    reasons = []
    if worker["outcome"] != "done":
        reasons.append(f"{worker['succeeded']} of {jobs} jobs succeeded before the timeout")
    if worker["wrongCount"] or worker["stray"]:
        reasons.append(f"{worker['wrongCount']} jobs ran the wrong number of times "
                       f"(e.g. {worker['wrong'][:3]}), stray {worker['stray'][:3]}")
    if worker["retries"] != (jobs + 4) // 5:
        reasons.append(f"{worker['retries']} retries, expected {(jobs + 4) // 5}")
    gap = worker["retryGapMs"]
    if gap and gap["min"] < BACKOFF_MS:
        reasons.append(f"a retry came {gap['min']} ms after its failed attempt, before the "
                       f"{BACKOFF_MS} ms backoff")
    if gap and gap["max"] > RETRY_WINDOW_MS:
        reasons.append(f"a retry came {gap['max']} ms after its failed attempt")
    counts = worker["counts"]
    left = {key: counts.get(key) for key in states if counts.get(key)}
    if left:
        reasons.append(f"left in the queue: {left}")
    if worker["mostRunning"] < 2:
        reasons.append("never more than one handler at once")
    return reasons


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tollgate", default="target/debug/tollgate",
                        help="the tollgate binary (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=500, help="jobs per run (default: 500)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="the worker's handlers at once (default: 4)")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tollgate-job-queues-"))
    redis_py.log(f"installing {' '.join(PACKAGES)} in {work}")
    install(work)
    direct_dir, tollgate_dir = work / "direct", work / "tollgate"
    direct_dir.mkdir()
    tollgate_dir.mkdir()
    redis = redis_py.RedisServer(direct_dir, unixsocket=direct_dir / "redis.sock")
    daemon = redis_py.Tollgate(str(pathlib.Path(args.tollgate).resolve()), tollgate_dir, "readme")
    failed = False
    try:
        for lib in LIBRARIES:
            for target, socket in (("direct", direct_dir / "redis.sock"),
                                   ("tollgate", daemon.resp)):
                worker, producer, errors = run(work, lib, socket, f"{lib}-{target}", args.jobs,
                                               args.concurrency)
                reasons = verdict(worker, producer, args.jobs)
                failed |= bool(reasons)
                figures = ""
                if worker and producer:
                    figures = (f"jobs {worker['jobs']}, attempts {worker['attempts']}, "
                               f"retries {worker['retries']} (gap {worker['retryGapMs']} ms), "
                               f"handlers at once {worker['mostRunning']}, produce "
                               f"{producer['ms']} ms, process {worker['ms']} ms, "
                               f"counts {worker['counts']}")
                print(f"{lib:5} {target:8} {'FAIL' if reasons else 'pass'}  {figures}",
                      flush=True)
                for reason in reasons:
                    print(f"    {reason}", flush=True)
                if reasons and errors.strip():
                    print("    stderr: " + errors.strip().replace("\n", "\n            ")[:2000])
    finally:
        daemon.stop()
        redis.stop()
    print(f"runs kept in {work}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
