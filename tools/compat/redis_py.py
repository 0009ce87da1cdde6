#!/usr/bin/env python3
"""redis-py's own test suite, run directly against redis-server and through Tollgate.

Downloads redis-py's sdist (pinned), unpacks it, installs its test dependencies in a venv, then
runs the same non-cluster pytest selection, for each RESP protocol asked for, twice:

- direct:   against a plain redis-server started on a loopback TCP port;
- tollgate: against `tollgate serve` with an allow-all policy, on an external redis-server the
            script starts on a Unix socket with the lane users that `tollgate redis-acl` prints
            (so exactly what the README tells an operator to do), reached over a loopback TCP
            port bridged to the daemon's RESP socket (redis-py's suite takes a redis:// URL).

It then prints every test that passes directly and fails through Tollgate, grouped by cause: by
test file/class, and by the first line of the error. A test whose call passed but whose teardown
failed is reported under its teardown error. Standard library only; run it with any Python 3.9+:

    python3 tools/compat/redis_py.py [--tollgate target/debug/tollgate] [--protocols 2,3]

`--lane-acl wide` gives the client and ADMIN lanes' users `+@admin +@dangerous` on top (still without
FLUSHALL/SWAPDB/SELECT and outside the reserved keyspace), which separates what the daemon does
from what the lane users' fixed rules refuse (issue 16).
"""

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

# The lane users for a private redis-server, as the end-to-end benchmark provisions them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))
from e2e import private_acl  # noqa: E402

REDIS_PY = "6.4.0"
# The suite's test dependencies (dev_requirements.txt), pinned. redis-entraid goes in without its
# dependencies, which would pull a newer redis from PyPI over the sdist's.
TEST_DEPS = [
    "pytest==8.3.5",
    "pytest-asyncio==0.26.0",
    "pytest-timeout==2.3.1",
    "coverage==7.6.12",
    "mock==5.2.0",
    "packaging==24.2",
    "ujson==5.10.0",
    "numpy==2.2.6",
    "PyJWT~=2.9.0",
    "msal~=1.31.0",
    "azure-identity~=1.20.0",
    "async-timeout==5.0.1",
]
NO_DEPS = ["redis-entraid==1.0.0"]

# Non-cluster, no modules, no TLS, no replica, no cloud credentials: what one redis-server serves.
MARKERS = "not onlycluster and not redismod and not ssl and not replica and not cp_integration"
IGNORED = [
    "tests/test_cluster.py",
    "tests/test_cluster_transaction.py",
    "tests/test_asyncio/test_cluster.py",
    "tests/test_asyncio/test_cluster_transaction.py",
]
# Per test; the suite's own is 30 s. A test that hangs through Tollgate costs this much.
TEST_TIMEOUT = 20

ALLOW_ALL = """\
# Compatibility run: every principal may run every command and take every lease.
principals:
  everyone: { any: true }
rules:
  - id: everything
    commands: ["*"]
    allow: compatibility run
  - id: leases
    leases: ["*"]
    allow: compatibility run
"""

# The lanes whose users `--lane-acl wide` widens (the ADMIN lane serves ACL, CONFIG GET, …).
CLIENT_LANES = ["regular", "blocking", "transaction", "script"]


def log(message):
    print(f"[compat] {message}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise SystemExit(f"compat: timed out waiting for {what}")


def prepare(work, version):
    """The unpacked sdist and a venv with its test dependencies, reused when already there."""
    source = work / f"redis-{version}"
    venv = work / "venv"
    python = venv / "bin" / "python"
    if not source.is_dir():
        log(f"downloading redis-py {version} sdist")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             f"redis=={version}", "-d", str(work)],
            check=True,
        )
        with tarfile.open(work / f"redis-{version}.tar.gz") as archive:
            archive.extractall(work)
    if not python.exists():
        log("creating the venv and installing the test dependencies")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run(pip + TEST_DEPS, check=True)
        subprocess.run(pip + ["--no-deps"] + NO_DEPS + [str(source)], check=True)
    return source, python


class RedisServer:
    def __init__(self, directory, port=None, unixsocket=None):
        self.directory = directory
        args = ["redis-server", "--save", "", "--appendonly", "no", "--dir", str(directory),
                "--enable-debug-command", "yes", "--logfile", str(directory / "redis.log")]
        if port is not None:
            args += ["--port", str(port), "--bind", "127.0.0.1"]
            self.ping = ["redis-cli", "-p", str(port)]
        else:
            args += ["--port", "0", "--unixsocket", str(unixsocket), "--unixsocketperm", "700"]
            self.ping = ["redis-cli", "-s", str(unixsocket)]
        self.process = subprocess.Popen(args)
        wait_for(self.answers, "redis-server")

    def answers(self):
        result = subprocess.run(self.ping + ["ping"], capture_output=True, text=True)
        return result.stdout.strip() == "PONG"

    def cli(self, *args, stdin=None):
        return subprocess.run(self.ping + list(args), input=stdin, capture_output=True,
                              text=True, check=True).stdout

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=10)


class Bridge(threading.Thread):
    """Loopback TCP port -> the daemon's RESP Unix socket, one Unix connection per TCP client."""

    def __init__(self, port, path):
        super().__init__(daemon=True)
        self.port, self.path = port, str(path)
        self.ready = threading.Event()

    def run(self):
        asyncio.run(self.serve())

    async def serve(self):
        server = await asyncio.start_server(self.client, "127.0.0.1", self.port)
        self.ready.set()
        async with server:
            await server.serve_forever()

    async def client(self, tcp_reader, tcp_writer):
        try:
            unix_reader, unix_writer = await asyncio.open_unix_connection(self.path)
        except OSError:
            tcp_writer.close()
            return
        await asyncio.gather(pump(tcp_reader, unix_writer), pump(unix_reader, tcp_writer))


async def pump(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        # A hang-up on one side hangs up the other, as a direct connection would.
        writer.close()


class Tollgate:
    def __init__(self, binary, directory, lane_acl):
        self.redis = RedisServer(directory, unixsocket=directory / "redis.sock")
        acl = directory / "acl"
        acl.mkdir()
        # The lane users the allow-all policy needs, as `tollgate redis-acl --config` prints them.
        (directory / "allow-all.yaml").write_text(ALLOW_ALL)
        policy_only = directory / "policy-only.yaml"
        policy_only.write_text(f"policy:\n  files: [{directory / 'allow-all.yaml'}]\n")
        users = subprocess.run([binary, "redis-acl", "--passwords", str(acl),
                                "--config", str(policy_only)],
                               capture_output=True, text=True, check=True).stdout
        self.redis.cli(stdin=private_acl(users))
        if lane_acl == "wide":
            for lane in CLIENT_LANES + ["admin"]:
                self.redis.cli("ACL", "SETUSER", f"tollgate-{lane}", "+@admin", "+@dangerous",
                               "-flushall", "-swapdb", "-select")
        lanes = subprocess.run([binary, "redis-acl", "--passwords", str(acl), "--lanes-yaml"],
                               capture_output=True, text=True, check=True).stdout
        runtime = directory / "run"
        config = directory / "tollgate.yaml"
        config.write_text(
            f"runtime_dir: {runtime}\n"
            f"redis:\n  address: unix:{directory / 'redis.sock'}\n  trusted_users: [default]\n"
            f"policy:\n  files: [{directory / 'allow-all.yaml'}]\n"
            f"logging:\n  level: warn\n" + lanes
        )
        self.log = open(directory / "tollgate.log", "w")
        self.process = subprocess.Popen([binary, "serve", "--config", str(config)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        self.resp = runtime / "resp.sock"
        wait_for(self.ready, "tollgate's /readyz", timeout=60)
        self.port = free_port()
        bridge = Bridge(self.port, self.resp)
        bridge.start()
        bridge.ready.wait(10)

    def ready(self):
        if self.process.poll() is not None:
            raise SystemExit(f"compat: tollgate exited {self.process.returncode}, see {self.log.name}")
        http = self.resp.with_name("http.sock")
        if not http.exists():
            return False
        result = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                 "--unix-socket", str(http), "http://localhost/readyz"],
                                capture_output=True, text=True)
        return result.stdout == "200"

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.redis.stop()


def run_suite(python, source, url, protocol, junit, output):
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               "-m", MARKERS, f"--timeout={TEST_TIMEOUT}", f"--redis-url={url}",
               f"--protocol={protocol}", f"--junit-xml={junit}"]
    command += [f"--ignore={path}" for path in IGNORED]
    log(f"pytest --protocol={protocol} --redis-url={url}")
    started = time.monotonic()
    with open(output, "w") as out:
        subprocess.run(command, cwd=source, stdout=out, stderr=subprocess.STDOUT)
    log(f"  took {time.monotonic() - started:.0f} s, output in {output}")


def outcomes(junit):
    """test id -> (outcome, phase, first line of the error) from pytest's JUnit XML."""
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "")
        test = f"{module}::{case.get('name')}"
        outcome, phase, error = "passed", "", ""
        for child in case:
            if child.tag == "skipped":
                outcome = "skipped"
            elif child.tag in ("failure", "error"):
                message = child.get("message") or (child.text or "").strip()
                if child.tag == "error" and message.startswith("failed on teardown"):
                    # Teardown errors are reported only when the call itself passed.
                    if outcome == "passed":
                        outcome, phase, error = "failed", "teardown", message
                else:
                    outcome, phase = "failed", ("setup" if child.tag == "error" else "call")
                    error = message
        results[test] = (outcome, phase, first_line(error))
    return results


def first_line(message):
    message = re.sub(r"^failed on (setup|teardown) with ", "", message)
    message = message.strip().strip('"').splitlines()[0] if message.strip() else "(no message)"
    return message[:160]


def cause(phase, error):
    """The error with test-specific details (numbers, keys, addresses) blurred, for grouping."""
    text = re.sub(r"0x[0-9a-f]+", "0x…", error)
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    text = re.sub(r"'[^']{0,80}'", "'…'", text)
    text = re.sub(r'"[^"]{0,80}"', '"…"', text)
    return f"[{phase}] {text[:120]}"


def report(results, protocols, lane_acl):
    lines = [f"redis-py {REDIS_PY}, lane ACL users: {lane_acl}"]
    summary = {}
    for protocol in protocols:
        direct, through = results[protocol]
        regressions = {
            # Missing: pytest stopped before reaching it (an INTERNALERROR, say).
            test: through.get(test, ("missing", "not run", "pytest stopped before this test"))
            for test, (outcome, _, _) in direct.items()
            if outcome == "passed" and through.get(test, ("missing",))[0] != "passed"
        }
        counts = {
            name: collections.Counter(outcome for outcome, _, _ in run.values())
            for name, run in (("direct", direct), ("tollgate", through))
        }
        summary[protocol] = {"counts": {k: dict(v) for k, v in counts.items()},
                             "regressions": len(regressions)}
        lines.append("")
        lines.append(f"== RESP{protocol}: {len(direct)} tests; direct {dict(counts['direct'])}; "
                     f"tollgate {dict(counts['tollgate'])}")
        lines.append(f"== pass directly, fail through Tollgate: {len(regressions)}")
        by_class = collections.Counter(test.rsplit("::", 1)[0] for test in regressions)
        lines.append("-- by file/class")
        for name, count in by_class.most_common():
            lines.append(f"{count:5}  {name}")
        by_cause = collections.defaultdict(list)
        for test, (_, phase, error) in regressions.items():
            by_cause[cause(phase, error)].append((test, error))
        lines.append("-- by cause (first line of the error), with every test id")
        for key, tests in sorted(by_cause.items(), key=lambda item: -len(item[1])):
            lines.append(f"{len(tests):5}  {key}")
            for test, error in sorted(tests):
                lines.append(f"         {test}  →  {error}")
    return "\n".join(lines), summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tollgate", default="target/debug/tollgate",
                        help="the tollgate binary (default: %(default)s)")
    parser.add_argument("--work", default="target/compat",
                        help="download/venv directory, kept between runs (default: %(default)s)")
    parser.add_argument("--protocols", default="2,3", help="RESP protocols to run (default: 2,3)")
    parser.add_argument("--lane-acl", choices=["readme", "wide"], default="readme",
                        help="lane users as `tollgate redis-acl` prints them, or widened (above)")
    parser.add_argument("--report", help="also write the report here")
    args = parser.parse_args()

    binary = str(Path(args.tollgate).resolve())
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    source, python = prepare(work, REDIS_PY)
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    results = {}
    runs = Path(tempfile.mkdtemp(prefix="tollgate-compat-"))
    for protocol in protocols:
        junit = {}
        direct_dir = runs / f"direct-{protocol}"
        direct_dir.mkdir()
        port = free_port()
        redis = RedisServer(direct_dir, port=port)
        try:
            junit["direct"] = direct_dir / "junit.xml"
            run_suite(python, source, f"redis://127.0.0.1:{port}/0", protocol, junit["direct"],
                      direct_dir / "pytest.out")
        finally:
            redis.stop()
        tollgate_dir = runs / f"tollgate-{protocol}"
        tollgate_dir.mkdir()
        daemon = Tollgate(binary, tollgate_dir, args.lane_acl)
        try:
            junit["tollgate"] = tollgate_dir / "junit.xml"
            run_suite(python, source, f"redis://127.0.0.1:{daemon.port}/0", protocol,
                      junit["tollgate"], tollgate_dir / "pytest.out")
        finally:
            daemon.stop()
        results[protocol] = (outcomes(junit["direct"]), outcomes(junit["tollgate"]))
    text, summary = report(results, protocols, args.lane_acl)
    print(text)
    print(json.dumps(summary))
    if args.report:
        Path(args.report).write_text(text + "\n")
    for protocol in protocols:
        # The lane users' passwords; the rest of the run is kept for reading.
        shutil.rmtree(runs / f"tollgate-{protocol}" / "acl", ignore_errors=True)
    log(f"runs kept in {runs}")


if __name__ == "__main__":
    main()
