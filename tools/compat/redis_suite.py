#!/usr/bin/env python3
"""Redis's own test suite, unit by unit, run directly against redis-server and through Tollgate.

The suite's external mode (`--host/--port`, `--singledb`, no debug, replication, save or slow
tests) against a plain redis-server on a loopback port, and against `tollgate serve` set up as
tools/compat/redis_py.py sets it up (allow-all policy, an external redis-server with the lane users
`tollgate redis-acl` prints, a loopback TCP port bridged to the RESP socket). Prints, per unit, the
tests that pass directly and not through Tollgate, and Tollgate's failures. The suite's harness
stops a unit at its first exception, so a refusal can hide the tests after it.

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


def run_unit(suite, port, unit, output):
    """The names of the unit's tests that passed, and its failure lines."""
    args = ["tclsh", "tests/test_helper.tcl", "--host", "127.0.0.1", "--port", str(port),
            "--singledb", "--clients", "1", "--timeout", "60", "--single", unit]
    for tag in TAGS:
        args += ["--tags", tag]
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
    parser.add_argument("units", nargs="+", help="units to run, e.g. unit/type/hash")
    args = parser.parse_args()
    suite = pathlib.Path(args.suite).resolve()
    (suite / "tests" / "tmp").mkdir(exist_ok=True)
    runs = pathlib.Path(tempfile.mkdtemp(prefix="tollgate-redis-suite-"))
    direct_dir, tollgate_dir = runs / "direct", runs / "tollgate"
    direct_dir.mkdir()
    tollgate_dir.mkdir()
    port = redis_py.free_port()
    redis = redis_py.RedisServer(direct_dir, port=port)
    daemon = redis_py.Tollgate(str(pathlib.Path(args.tollgate).resolve()), tollgate_dir, "readme")
    totals = [0, 0, 0]
    try:
        for unit in args.units:
            name = unit.replace("/", "_")
            direct, _ = run_unit(suite, port, unit, direct_dir / f"{name}.out")
            through, failed = run_unit(suite, daemon.port, unit, tollgate_dir / f"{name}.out")
            passed_through = set(through)
            lost = [test for test in direct if test not in passed_through]
            totals = [totals[0] + len(direct), totals[1] + len(through), totals[2] + len(lost)]
            print(f"{unit}: passed directly {len(direct)}, through Tollgate {len(through)}; "
                  f"passed directly, not through: {len(lost)}", flush=True)
            for test in lost:
                print(f"    not through: {test}", flush=True)
            for line in failed:
                print(f"    tollgate: {line[:220]}", flush=True)
    finally:
        daemon.stop()
        redis.stop()
    print(f"total: passed directly {totals[0]}, through Tollgate {totals[1]}; "
          f"passed directly, not through: {totals[2]}")
    print(f"runs kept in {runs}")


if __name__ == "__main__":
    main()
