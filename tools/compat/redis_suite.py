#!/usr/bin/env python3
"""Redis's own test suite, unit by unit, run directly against redis-server and through Tollgate.

The suite's external mode (`--host/--port`, `--singledb`, no debug, replication, save or slow
tests) against a plain redis-server on a loopback port, and against `tollgate serve` set up as
tools/compat/redis_py.py sets it up (allow-all policy, an external redis-server with the lane users
`tollgate redis-acl` prints, a loopback TCP port bridged to the RESP socket). Prints, per unit, the
tests that pass directly and not through Tollgate, and Tollgate's failures. Each unit gets a
fresh redis-server and a fresh Tollgate (units change the server's configuration: `type/list`
raises `proto-max-bulk-len`, which `protocol` then trips over when they share one).

The suite's harness stops a unit at its first exception, so a refusal can hide the tests after it.
`--skip-deliberate` skips, through Tollgate only, the tests DELIBERATE lists (each refused on
purpose, with the reason), so the tests after them run; they are still counted as passed directly
and not through, and printed with their reason.

    git -C redis archive 7.0.15 tests runtest | tar -x -C /tmp/redis-tests
    python3 tools/compat/redis_suite.py --suite /tmp/redis-tests unit/type/hash unit/multi …
"""

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import redis_py  # noqa: E402  (the same redis-server and Tollgate set-up)

TAGS = ["-needs:debug", "-needs:repl", "-needs:save", "-needs:pfdebug",
        "-needs:config-maxmemory", "-needs:reset", "-slow"]
# A unit's tests may wait up to the harness's own timeout; the whole unit gets this long.
UNIT_TIMEOUT = 900


SORT_PATTERNS = ("SORT's BY/GET patterns are refused by Redis's ACL: Redis allows them only to a "
                 "user with access to every key, and the lane users' keys exclude the daemon's "
                 "reserved tollgate:*")

# Tests of a deliberate difference that stops their unit (an exception, or a wait for what never
# comes) or leaves state behind that fails a later test: unit -> {test name, or `/regexp`: why}.
# Skipped through Tollgate with --skip-deliberate.
DELIBERATE = {
    "unit/multi": {
        "FLUSHALL is able to touch the watched keys":
            "FLUSHALL after WATCH is refused: whole-keyspace commands are served key by key, "
            "which a transaction cannot hold",
        "FLUSHALL does not touch non affected keys": "the same, FLUSHALL after WATCH",
        "FLUSHDB is able to touch the watched keys": "the same, FLUSHDB after WATCH",
        "FLUSHDB does not touch non affected keys": "the same, FLUSHDB after WATCH",
        "Flushall while watching several keys by one client": "the same, FLUSHALL after WATCH",
    },
    "unit/pubsub": {
        "PubSub messages with CLIENT REPLY OFF":
            "a channel's message and a matching pattern's pmessage come in either order (the "
            "two names live on the shared subscriber connections they hash to); failing, the "
            "test leaves its pattern subscribed, which fails NUMPAT's count after it",
    },
    "unit/tracking": {
        "Tracking NOLOOP mode in BCAST mode works":
            "NOLOOP in BCAST mode is not kept: the daemon learns of every write from one "
            "connection to Redis that cannot say which client wrote, and a BCAST client that "
            "holds its own value is told of its own write rather than risk missing another's; "
            "the extra invalidation is left for the next test to read",
        "Tracking gets notification of expired keys":
            "the same: NOLOOP in BCAST mode (its own SET is told)",
        "Tracking only occurs for scripts when a command calls a read-only command":
            "a script's reads happen inside Redis, where the daemon does not see them: every "
            "key a script declares is tracked, whether or not it calls a read command, so a "
            "script that only writes tracks its keys too (an extra invalidation, never a "
            "missing one)",
        "Tracking invalidation message of eviction keys should be before response":
            "an eviction's invalidation reaches the daemon on its own connection from Redis, and "
            "is held behind the replies in flight (never before a read's reply it may concern): "
            "it comes after the reply of the command whose memory evicted the key, not before; "
            "failing, the test leaves maxmemory set, which fails the unit's later writes",
        "flushdb tracking invalidation message is not interleaved with transaction response":
            "FLUSHDB inside MULTI is refused: whole-keyspace commands are served key by key, "
            "which a transaction cannot hold (as in unit/multi)",
    },
    "unit/scripting": {
        "Script ACL check":
            "ACL SETUSER is refused on every client lane (a client creating Redis users could "
            "reach Redis around the daemon)",
        "SORT BY <constant> with GET gets ordered for scripting": SORT_PATTERNS,
    },
    "unit/sort": {
        "/SORT BY (key|hash field)": SORT_PATTERNS,
        "/SORT GET": SORT_PATTERNS,
        "SORT_RO - Successful case": SORT_PATTERNS,
        "SORT_RO get keys": SORT_PATTERNS,
        "SORT will complain with numerical sorting and bad doubles (2)": SORT_PATTERNS,
        "SORT BY sub-sorts lexicographically if score is the same": SORT_PATTERNS,
    },
    "unit/pause": {
        "Test special commands are paused by RO":
            "a write held by CLIENT PAUSE holds the shared REGULAR connection it was written on: "
            "another client's command written behind it (here the new client's PING, which goes "
            "to Redis) waits with it, and past resp.command_timeout (10 s) both fail",
        "Test scripts are blocked by pause RO":
            "two clients' EVALs share a SCRIPT connection: Redis holds the first and has not "
            "read the second, so it counts 1 blocked client, not 2; failing there, the test "
            "leaves Redis paused for the tests after it",
        "Test multiple clients can be queued up and unblocked":
            "the same: three clients' SETs share a REGULAR connection, Redis counts 1 blocked "
            "client, not 3, and the test leaves Redis paused",
        "Test that client pause starts at the end of a transaction":
            "the same as the first: a GET written behind another client's paused SET on the "
            "shared REGULAR connection waits with it",
    },
    "unit/introspection": {
        "MONITOR can log commands issued by the scripting engine":
            "MONITOR shows what the daemon's sessions run; a script's calls happen inside Redis",
        "MONITOR can log commands issued by functions": "the same, a function's calls",
    },
}


def deliberate(skipped, test):
    """Why `test` was skipped, as the harness matches `--skiptest` (`/` starts a regexp)."""
    for pattern, reason in skipped.items():
        if test == pattern or pattern.startswith("/") and re.search(pattern[1:], test):
            return reason
    return None


def run_unit(suite, port, unit, output, skip=()):
    """The names of the unit's tests that passed, and its failure lines."""
    args = ["tclsh", "tests/test_helper.tcl", "--host", "127.0.0.1", "--port", str(port),
            "--singledb", "--clients", "1", "--timeout", "60", "--single", unit]
    for tag in TAGS:
        args += ["--tags", tag]
    for test in skip:
        args += ["--skiptest", test]
    try:
        done = subprocess.run(args, cwd=suite, capture_output=True, text=True,
                              timeout=UNIT_TIMEOUT)
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        text = (expired.stdout or b"").decode() + "\n[TIMEOUT]: the whole unit\n"
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    output.write_text(text)
    lines = text.splitlines()
    passed = [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in lines
              if line.startswith("[ok]")]
    failed = [line for line in lines if line.startswith(("[err]", "[exception]", "[TIMEOUT]"))]
    return passed, failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tollgate", default="target/debug/tollgate",
                        help="the tollgate binary (default: %(default)s)")
    parser.add_argument("--suite", required=True,
                        help="a directory holding Redis's runtest and tests/ (the server's version)")
    parser.add_argument("--skip-deliberate", action="store_true",
                        help="skip, through Tollgate, the deliberate refusals that stop a unit")
    parser.add_argument("units", nargs="+", help="units to run, e.g. unit/type/hash")
    args = parser.parse_args()
    suite = pathlib.Path(args.suite).resolve()
    (suite / "tests" / "tmp").mkdir(exist_ok=True)
    binary = str(pathlib.Path(args.tollgate).resolve())
    runs = pathlib.Path(tempfile.mkdtemp(prefix="tollgate-redis-suite-"))
    totals = [0, 0, 0]
    for unit in args.units:
        name = unit.replace("/", "_")
        direct_dir, tollgate_dir = runs / name / "direct", runs / name / "tollgate"
        direct_dir.mkdir(parents=True)
        tollgate_dir.mkdir()
        skipped = DELIBERATE.get(unit, {}) if args.skip_deliberate else {}
        port = redis_py.free_port()
        redis = redis_py.RedisServer(direct_dir, port=port)
        try:
            direct, _ = run_unit(suite, port, unit, runs / name / "direct.out")
        finally:
            redis.stop()
        daemon = redis_py.Tollgate(binary, tollgate_dir, "readme")
        try:
            through, failed = run_unit(suite, daemon.port, unit, runs / name / "tollgate.out",
                                       skip=skipped)
        finally:
            daemon.stop()
        passed_through = set(through)
        lost = list(dict.fromkeys(test for test in direct if test not in passed_through))
        totals = [totals[0] + len(direct), totals[1] + len(through), totals[2] + len(lost)]
        print(f"{unit}: passed directly {len(direct)}, through Tollgate {len(through)}; "
              f"passed directly, not through: {len(lost)}", flush=True)
        for test in lost:
            reason = deliberate(skipped, test)
            why = f"  (skipped through Tollgate: {reason})" if reason else ""
            print(f"    not through: {test}{why}", flush=True)
        for line in failed:
            print(f"    tollgate: {line[:220]}", flush=True)
    print(f"total: passed directly {totals[0]}, through Tollgate {totals[1]}; "
          f"passed directly, not through: {totals[2]}")
    print(f"runs kept in {runs}")


if __name__ == "__main__":
    main()
