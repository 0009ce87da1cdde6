#!/usr/bin/env python3
"""Real Lua-using apps as tenants of policies/examples/tenants.yaml, through the daemon (issue 30).

Starts `tollgate serve` on its embedded redis-server with the tenants example (acme and globex
mapped to the OS users `tollgate-acme` and `tollgate-globex`, created if missing), its sockets
mode 0666 so that those users can connect. Every app runs as the acme OS user (setpriv), changed
only in its key prefix:

- BullMQ (prefix `acme:bull`): a worker (several handlers and a QueueEvents reading the events
  stream) and a producer adding the jobs one by one; every fifth job fails once and is retried
  after a fixed 300 ms backoff. Passes when each job ran exactly as often as it should, every
  job completed, the events stream told of each, and nothing is left waiting, active or delayed.
- BullMQ features (prefix `acme:bull`): a flow (parent and children), a delayed job, a
  rate-limited worker, a job scheduler, then `obliterate`: scripts that build keys from arguments.
- Bull 4 (prefix `acme:bull4`): the same worker and producer.
- limits (`key_prefix` `acme:limits`): the fixed-window, moving-window and sliding-window-counter
  strategies (each a Lua script of limits') admit exactly the limit, sequentially and from four
  threads at once, then refuse.
- python-redis-lock (lock names `acme:...`, keys `lock:acme:...`): a holder keeps a lock past its
  expiry by renewal (its EXTEND script), a second process is refused then waits and gets it once
  released (its UNLOCK script signals), and two processes incrementing a counter under the lock
  lose no increment.

Then each app again, still as acme, configured with globex's prefix: it must be refused (the reply
names NOPERM and a rule that denies, or acme's scope; a refused INFO does not count) and nothing
may appear under globex's keys on Redis (read with the embedded server's administrator,
`tollgate-root`). Last (unless --acme-only), the apps as the globex OS user with globex's prefix:
they work there, on the script cache acme's runs filled; every key is then one tenant's.

The policy is the example with the real uids and two additions the apps need, printed at start:
see EXTRA_RULES. Needs root, node, npm, python3 with venv at /usr/bin/python3 (the venv's
interpreter must be one the tenant's OS user can run), redis-cli, curl and setpriv; downloads the pinned
packages below (npm, PyPI) into a temporary directory (or --work).

    python3 tools/compat/tenant_apps.py [--tollgate target/release/tollgate] [--jobs 200]
"""

import argparse
import json
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import job_queues  # noqa: E402  (the job queues' verdict)
import redis_py  # noqa: E402  (log, wait_for)

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLE = ROOT / "policies" / "examples" / "tenants.yaml"
NODE_APP = HERE / "tenant_apps" / "app.mjs"
PY_APP = HERE / "tenant_apps" / "apps.py"

NPM_PACKAGES = ["bullmq@5.81.5", "bull@4.16.5"]
PY_PACKAGES = ["limits==5.8.0", "python-redis-lock==4.0.1", "redis==6.4.0"]
# The venv's interpreter: one every OS user may run (a pyenv one under /root is not).
SYSTEM_PYTHON = "/usr/bin/python3"
TENANTS = {"acme": "tollgate-acme", "globex": "tollgate-globex"}
WORKER_TIMEOUT_S = 300
LIMIT = 10
LOCK_HOLD_S = 2.5
LOCK_COUNT = 40

# What the runner's policy adds to the example, each with the reason. (rule text, inserted before
# the rule with this id, why.)
EXTRA_RULES = [
    ("""\
  # Added by tools/compat/tenant_apps.py: BullMQ reads the server's version from INFO before it
  # does anything (RedisConnection.getRedisVersionAndType, no fallback), and ioredis sends INFO as
  # its ready check. INFO is @dangerous, so this comes before no-whole-keyspace. The daemon
  # already edits INFO for a caller that does not see every key: no db0 line, no per-command
  # counts, connected_clients its own sessions.
  - id: tenant-info
    principals: [acme, globex]
    commands: [INFO]
    allow: client libraries read the server's version
""", "no-whole-keyspace",
     "INFO for acme and globex (BullMQ's version check; ioredis's ready check)"),
    ("""\
  # Added by tools/compat/tenant_apps.py: python-redis-lock names its keys `lock:<name>` and
  # `lock-signal:<name>` (fixed in the library), so a tenant's lock `acme:x` is `lock:acme:x`.
  - id: acme-redis-locks
    principals: [acme]
    commands: ["@read", "@write", "@keyspace"]
    keys: ["lock:acme:*", "lock-signal:acme:*"]
    allow: python-redis-lock's keys of acme's locks
  - id: globex-redis-locks
    principals: [globex]
    commands: ["@read", "@write", "@keyspace"]
    keys: ["lock:globex:*", "lock-signal:globex:*"]
    allow: python-redis-lock's keys of globex's locks
""", "acme-keys",
     "lock:acme:* and lock-signal:acme:* for acme, likewise globex (python-redis-lock's fixed "
     "`lock:`/`lock-signal:` key names)"),
]

# What a refusal says: the daemon's (`NOPERM tollgate: rule <id> denies <COMMAND>: …`), or Redis's
# of a script's call outside acme's scope, with the daemon's note naming the scope's rules
# (`(tollgate: scope of rule acme-keys does not include that key)`; `rules acme-redis-locks,
# acme-keys` with the additions below).
def is_refusal(text):
    """A refusal of the other tenant's keys (not of INFO, which names none)."""
    return bool(REFUSAL.search(text)) and "denies INFO" not in text


REFUSAL = re.compile(r"NOPERM|rule \S+ denies|can't access at least one of the keys.*\(tollgate: "
                     r"scope of rules? [^)]*acme-keys[^)]* does not include that key\)")


class OsUser:
    def __init__(self, name):
        if subprocess.run(["id", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                            "/usr/sbin/nologin", name], check=True)
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid

    def command(self, argv):
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--"] + argv


def tenant_env(work):
    return dict(os.environ, HOME=str(work / "home"), PYTHONDONTWRITEBYTECODE="1",
                WORKER_TIMEOUT_MS=str(WORKER_TIMEOUT_S * 1000))


def install(work):
    """node_modules and a venv in `work`, readable by every user; reused when already there."""
    if not all((work / "node_modules" / package.rsplit("@", 1)[0] / "package.json").is_file()
               for package in NPM_PACKAGES):
        redis_py.log(f"npm install {' '.join(NPM_PACKAGES)}")
        with open(work / "npm.log", "w") as out:
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(work)]
                           + NPM_PACKAGES, stdout=out, stderr=subprocess.STDOUT, check=True)
    python = work / "venv" / "bin" / "python"
    if not python.exists():
        redis_py.log(f"venv ({SYSTEM_PYTHON}) with {' '.join(PY_PACKAGES)}")
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(work / "venv")], check=True)
        with open(work / "pip.log", "w") as out:
            subprocess.run([str(python), "-m", "pip", "install"] + PY_PACKAGES, stdout=out,
                           stderr=subprocess.STDOUT, check=True)
    shutil.copy(NODE_APP, work / "app.mjs")
    shutil.copy(PY_APP, work / "apps.py")
    (work / "home").mkdir(exist_ok=True)
    subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
    os.chmod(work / "home", 0o777)
    return python


def policy(users, additions=True):
    text = EXAMPLE.read_text()
    for tenant, uid in (("acme", 2001), ("globex", 2002)):
        old = f"uids: [{uid}]"
        assert old in text, f"{EXAMPLE} changed shape: no `{old}`"
        text = text.replace(old, f"uids: [{users[tenant].uid}]")
    for rule, before, _ in EXTRA_RULES if additions else []:
        anchor = f"  - id: {before}\n"
        assert anchor in text, f"{EXAMPLE} changed shape: no rule {before}"
        text = text.replace(anchor, rule + anchor, 1)
    return text


class Daemon:
    def __init__(self, binary, work, policy_file, log_level):
        self.dir = work / "daemon"
        self.dir.mkdir(exist_ok=True)
        os.chmod(self.dir, 0o755)
        self.runtime = self.dir / "run"
        self.resp = self.dir / "resp.sock"
        self.http = self.dir / "http.sock"
        config = self.dir / "tollgate.yaml"
        config.write_text(
            f"runtime_dir: {self.runtime}\n"
            f"listen:\n  resp: {self.resp}\n  http: {self.http}\n  mode: \"0666\"\n"
            f"policy:\n  files: [{policy_file}]\n"
            f"logging:\n  level: {log_level}\n")
        self.log = open(self.dir / "tollgate.log", "w")
        self.process = subprocess.Popen([binary, "serve", "--config", str(config)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        redis_py.wait_for(self.ready, "tollgate's /readyz", timeout=60)
        password = (self.runtime / "admin.password").read_text().strip()
        self.admin_cli = ["redis-cli", "-s", str(self.runtime / "redis.sock"), "--user",
                          "tollgate-root", "--pass", password, "--no-auth-warning"]
        self.monitor = None

    def ready(self):
        if self.process.poll() is not None:
            raise SystemExit(f"tenant_apps: tollgate exited {self.process.returncode}, see "
                             f"{self.log.name}")
        if not self.http.exists():
            return False
        result = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                 "--unix-socket", str(self.http), "http://localhost/readyz"],
                                capture_output=True, text=True)
        return result.stdout == "200"

    def admin(self, *args):
        """The embedded Redis's answer to `args`, as its administrator (outside the daemon)."""
        return subprocess.run(self.admin_cli + ["--raw"] + list(args), capture_output=True,
                              text=True, check=True).stdout

    def keys(self, pattern):
        return sorted(line for line in self.admin("KEYS", pattern).splitlines() if line)

    def start_monitor(self, path):
        self.monitor_out = open(path, "w")
        self.monitor = subprocess.Popen(self.admin_cli + ["MONITOR"], stdout=self.monitor_out,
                                        stderr=subprocess.STDOUT)

    def stop(self):
        if self.monitor is not None:
            self.monitor.terminate()
            self.monitor.wait(timeout=10)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


class Runner:
    def __init__(self, work, python, daemon, users):
        self.work, self.python, self.daemon, self.users = work, python, daemon, users
        self.env = tenant_env(work)
        self.rows = []
        self.refusals = []  # (app, tenant, prefix, {step: [what it was told]})
        self.act_as("acme")

    def act_as(self, tenant):
        """Run the apps as this tenant's OS user from now on."""
        self.tenant, self.user = tenant, self.users[tenant]

    # -- processes as acme --------------------------------------------------------------------

    def node(self, *args):
        return self.user.command(["node", str(self.work / "app.mjs")] + [str(a) for a in args])

    def py(self, *args):
        return self.user.command([str(self.python), str(self.work / "apps.py")]
                                 + [str(a) for a in args])

    def run(self, argv, timeout=WORKER_TIMEOUT_S):
        result = subprocess.run(argv, cwd=self.work, env=self.env, capture_output=True,
                                text=True, timeout=timeout)
        return last_json(result.stdout), result.stderr + (
            f"\n(exit {result.returncode})" if result.returncode else "")

    def spawn(self, argv, stderr_path):
        errors = open(stderr_path, "w+")
        process = subprocess.Popen(argv, cwd=self.work, env=self.env, stdout=subprocess.PIPE,
                                   stderr=errors, text=True)
        return process, errors

    # -- the table ----------------------------------------------------------------------------

    def record(self, app, prefix, expected, started, reasons, figures, stderr="", said=None):
        elapsed = time.monotonic() - started
        result = "FAIL" if reasons else ("refused" if expected == "refused" else "pass")
        self.rows.append((app, self.tenant, prefix, expected, result, elapsed, figures, reasons))
        if said:
            self.refusals.append((app, self.tenant, prefix, said))
        redis_py.log(f"{app} as {self.tenant}, {prefix}: {result} in {elapsed:.1f} s")
        for reason in reasons:
            redis_py.log(f"    {reason}")
        if reasons and stderr.strip():
            redis_py.log("    stderr: " + stderr.strip().replace("\n", "\n            ")[-3000:])

    # -- BullMQ and Bull ----------------------------------------------------------------------

    def queue(self, lib, prefix, jobs, concurrency):
        started = time.monotonic()
        name = f"compat-{int(time.time())}"
        worker, errors = self.spawn(self.node(lib, "worker", self.daemon.resp, prefix, name,
                                              jobs, concurrency),
                                    self.work / f"{lib}.worker.err")
        redis_py.wait_for(lambda: "worker ready" in pathlib.Path(errors.name).read_text()
                          or worker.poll() is not None, f"the {lib} worker", timeout=60)
        time.sleep(1)  # its loops reach their blocking pop on the empty queue first
        producer, producer_err = self.run(self.node(lib, "producer", self.daemon.resp, prefix,
                                                    name, jobs))
        try:
            out, _ = worker.communicate(timeout=WORKER_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, _ = worker.communicate()
        errors.seek(0)
        stderr = errors.read() + producer_err
        result = last_json(out)
        reasons = queue_verdict(result, producer, jobs)
        keys = self.daemon.keys(f"{prefix}:{name}:*")
        if not keys:
            reasons.append(f"no key under {prefix}:{name}: on Redis")
        figures = ""
        if result and producer:
            figures = (f"{result['jobs']} jobs, {result['attempts']} attempts, "
                       f"{result['retries']} retries (gap {result['retryGapMs']} ms), "
                       f"{result['mostRunning']} handlers at once, produce {producer['ms']} ms, "
                       f"process {result['ms']} ms; {len(keys)} keys under {prefix}:{name}:")
            if result.get("eventsCompleted") is not None:
                figures += f"; {result['eventsCompleted']} completed events"
        self.record(lib, prefix, "works", started, reasons, figures, stderr)

    def features(self, prefix):
        """BullMQ's flows, delayed jobs, rate limiter, job scheduler and obliterate."""
        started = time.monotonic()
        name = f"features-{int(time.time())}"
        result, stderr = self.run(self.node("bullmq", "features", self.daemon.resp, prefix, name),
                                  timeout=120)
        reasons = []
        if result is None:
            reasons.append("no result")
        else:
            parent = result["parent"]
            if parent != {"children": 3, "sum": 6, "childrenBefore": 3} or result["children"] != 3:
                reasons.append(f"flow: parent saw {parent}, {result['children']} children ran")
            delayed = result["delayedAfterMs"]
            if delayed is None or not 700 <= delayed < 5000:
                reasons.append(f"the delayed job (700 ms) ran after {delayed} ms")
            if result["ticks"] < 3:
                reasons.append(f"the job scheduler made {result['ticks']} of 3 jobs")
            if result["limited"] != 10 or (result["limitedSpanMs"] or 0) < 1900:
                reasons.append(f"rate limiter: {result['limited']} of 10 jobs over "
                               f"{result['limitedSpanMs']} ms (4 a second: at least 2 s)")
            left = {k: v for k, v in result["counts"].items() if v and k != "completed"}
            if left:
                reasons.append(f"left in the queue: {left}")
            if result["obliterated"] != "ok":
                reasons.append(f"obliterate: {result['obliterated']}")
            if result["errors"]:
                reasons.append(f"errors: {result['errors']}")
        # obliterate leaves the rate limiter's counter (BullMQ's obliterate-2.lua does not list
        # `limiter`); it expires after the limiter's duration, 1 s.
        time.sleep(1.5)
        left_keys = self.daemon.keys(f"{prefix}:{name}*")
        if left_keys:
            reasons.append(f"{len(left_keys)} keys left after obliterate: {left_keys[:5]}")
        figures = "" if result is None else (
            f"flow 3 children -> parent sum {(result['parent'] or {}).get('sum')}; delayed 700 ms "
            f"ran at {result['delayedAfterMs']} ms; limiter 10 jobs in {result['limitedSpanMs']} "
            f"ms; scheduler {result['ticks']} jobs; obliterate {result['obliterated']}, "
            f"{len(left_keys)} keys left")
        self.record("bullmq features", prefix, "works", started, reasons, figures, stderr)

    def queue_refused(self, lib, prefix):
        started = time.monotonic()
        name = f"compat-{int(time.time())}"
        result, stderr = self.run(self.node(lib, "refused", self.daemon.resp, prefix, name),
                                  timeout=60)
        reasons = []
        if result is None:
            reasons.append("no result")
        else:
            if result["add"] == "added":
                reasons.append("adding a job under another tenant's prefix was not refused")
            elif not is_refusal(result["add"]):
                reasons.append(f"adding a job failed, but not as a refusal: {result['add']}")
            if result["processed"]:
                reasons.append(f"the worker processed {result['processed']} jobs")
            if not any(is_refusal(e) for e in result["workerErrors"]):
                reasons.append(f"the worker was not refused: {result['workerErrors']}")
        reasons += self.nothing_under(prefix.split(":")[0])
        said = {} if result is None else {"add": [result["add"]],
                                          "worker": result["workerErrors"]}
        self.record(lib, prefix, "refused", started, reasons, gists(said), stderr, said)

    # -- limits -------------------------------------------------------------------------------

    def limits(self, prefix):
        started = time.monotonic()
        result, stderr = self.run(self.py("limits", self.daemon.resp, prefix, LIMIT), timeout=120)
        reasons = []
        figures = []
        if result is None:
            reasons.append("no result")
        else:
            if result["ping"] is not True:
                reasons.append(f"storage check (PING): {result['ping']}")
            for name, s in result["strategies"].items():
                expected = "1" * LIMIT + "000"
                if s["sequence"] != expected:
                    reasons.append(f"{name}: hits admitted {s['sequence']}, expected {expected}")
                if s["test_after"] is not False or s["remaining"] != 0:
                    reasons.append(f"{name}: after the limit test() {s['test_after']}, "
                                   f"remaining {s['remaining']}")
                if s["concurrent_admitted"] != LIMIT:
                    reasons.append(f"{name}: {s['concurrent_admitted']} of "
                                   f"{s['concurrent_tries']} concurrent hits admitted, expected "
                                   f"{LIMIT}")
                if s["after_clear"] is not True:
                    reasons.append(f"{name}: not admitted after clear()")
                if not s["key"].startswith(prefix + ":"):
                    reasons.append(f"{name}: key {s['key']} not under {prefix}:")
                figures.append(f"{name} {s['sequence'].count('1')}/{len(s['sequence'])} "
                               f"+{s['concurrent_admitted']}/{s['concurrent_tries']} at once")
            keys = self.daemon.keys(f"{prefix}:*")
            if not keys:
                reasons.append(f"no key under {prefix}: on Redis")
            figures.append(f"{len(keys)} keys under {prefix}:")
        self.record("limits", prefix, "works", started, reasons, "; ".join(figures), stderr)

    def limits_refused(self, prefix):
        started = time.monotonic()
        result, stderr = self.run(self.py("refused-limits", self.daemon.resp, prefix),
                                  timeout=60)
        reasons = []
        if result is None:
            reasons.append("no result")
        else:
            for name, outcome in result.items():
                if "error" not in outcome:
                    reasons.append(f"{name}: not refused: {outcome['result']}")
                elif not is_refusal(outcome["error"]):
                    reasons.append(f"{name}: failed, but not as a refusal: {outcome['error']}")
        reasons += self.nothing_under(prefix.split(":")[0])
        said = {name: [outcome.get("error", outcome.get("result"))]
                for name, outcome in (result or {}).items()}
        self.record("limits", prefix, "refused", started, reasons, gists(said), stderr, said)

    # -- python-redis-lock --------------------------------------------------------------------

    def lock(self, tenant):
        started = time.monotonic()
        name = f"{tenant}:compat-{int(time.time())}"
        reasons, figures = [], []
        holder, errors = self.spawn(self.py("lock-hold", self.daemon.resp, name, LOCK_HOLD_S),
                                    self.work / "lock.holder.err")
        redis_py.wait_for(lambda: holder.poll() is not None
                          or self.daemon.keys(f"lock:{name}"), "the lock holder", timeout=30)
        # Past the 1 s expiry only the holder's renewal keeps the lock.
        waiter, wait_err = self.run(self.py("lock-wait", self.daemon.resp, name, 1.5), timeout=60)
        out, _ = holder.communicate(timeout=60)
        errors.seek(0)
        stderr = errors.read() + wait_err
        held = last_json(out)
        if held is None or waiter is None:
            reasons.append("no result")
        else:
            if not held["acquired"] or not held["still_ours_at_release"]:
                reasons.append(f"holder: {held} (renewal past the 1 s expiry)")
            if waiter["try_while_held"] is not False:
                reasons.append("a second process took the lock while it was held")
            if not waiter["acquired"]:
                reasons.append("the waiting process never got the lock")
            else:
                gap = waiter["acquired_at"] - held["released"]
                if gap < -0.05 or gap > 1.0:
                    reasons.append(f"the waiter got the lock {gap:+.3f} s after its release")
                figures.append(f"renewed past expiry, waiter refused then woken "
                               f"{(waiter['acquired_at'] - held['released']) * 1000:.0f} ms "
                               f"after release")
        # Two processes incrementing one counter under the lock.
        counter = f"{tenant}:compat-counter-{int(time.time())}"
        a, a_err = self.spawn(self.py("lock-count", self.daemon.resp, name, counter, LOCK_COUNT),
                              self.work / "lock.count-a.err")
        b, b_err = self.spawn(self.py("lock-count", self.daemon.resp, name, counter, LOCK_COUNT),
                              self.work / "lock.count-b.err")
        outs = [last_json(p.communicate(timeout=120)[0]) for p in (a, b)]
        for e in (a_err, b_err):
            e.seek(0)
            stderr += e.read()
        total = self.daemon.admin("GET", counter).strip()
        if None in outs:
            reasons.append("a counting process gave no result")
        else:
            contended = sum(o["contended"] for o in outs)
            if total != str(2 * LOCK_COUNT):
                reasons.append(f"counter {total}, expected {2 * LOCK_COUNT}: an increment was "
                               f"lost")
            if contended == 0:
                reasons.append("the two counting processes never contended")
            figures.append(f"counter {total}/{2 * LOCK_COUNT} ({contended} contended)")
        left = self.daemon.keys(f"lock:{name}")
        if left:
            reasons.append(f"lock key left after release: {left}")
        self.record("python-redis-lock", f"lock:{tenant}:", "works", started, reasons,
                    "; ".join(figures), stderr)

    def lock_refused(self, tenant):
        started = time.monotonic()
        name = f"{tenant}:compat-{int(time.time())}"
        result, stderr = self.run(self.py("refused-lock", self.daemon.resp, name), timeout=60)
        reasons = []
        if result is None:
            reasons.append("no result")
        else:
            for step, outcome in result.items():
                if "error" not in outcome:
                    reasons.append(f"{step}: not refused: {outcome['result']}")
                elif not is_refusal(outcome["error"]):
                    reasons.append(f"{step}: failed, but not as a refusal: {outcome['error']}")
        reasons += self.nothing_under(tenant)
        said = {step: [outcome.get("error", outcome.get("result"))]
                for step, outcome in (result or {}).items()}
        self.record("python-redis-lock", f"lock:{tenant}:", "refused", started, reasons,
                    gists(said), stderr, said)

    def keyspace(self, tenants):
        """Every key on Redis (database 0) is of one of `tenants`."""
        started = time.monotonic()
        keys = self.daemon.keys("*")
        owners = {}
        for key in keys:
            owner = next((tenant for tenant in ("acme", "globex")
                          if re.match(rf"(lock:|lock-signal:)?{tenant}:", key)), "other")
            owners[owner] = owners.get(owner, 0) + 1
        reasons = [f"{count} keys of {owner}" for owner, count in owners.items()
                   if owner not in tenants]
        self.record("redis keyspace", "*", " + ".join(tenants) + " only", started, reasons,
                    f"{len(keys)} keys in db 0: {owners}")

    def nothing_under(self, tenant):
        found = []
        for pattern in (f"{tenant}:*", f"lock:{tenant}:*", f"lock-signal:{tenant}:*"):
            found += self.daemon.keys(pattern)
        return [f"written under {tenant}'s keys: {found[:5]}"] if found else []


def queue_verdict(worker, producer, jobs):
    """job_queues.py's verdict (same backoff and window), with BullMQ's further states, the
    completed count and the events stream's."""
    reasons = job_queues.verdict(worker, producer, jobs, states=(
        "waiting", "active", "delayed", "failed", "prioritized", "waiting-children"))
    if worker is None or producer is None:
        return reasons
    counts = worker["counts"]
    if counts.get("completed") != jobs:
        reasons.append(f"{counts.get('completed')} completed in the queue, expected {jobs}")
    if worker.get("eventsCompleted") is not None and worker["eventsCompleted"] != jobs:
        reasons.append(f"{worker['eventsCompleted']} completed events read, expected {jobs}")
    if worker.get("errors"):
        reasons.append(f"errors: {worker['errors']}")
    return reasons


def gist(text):
    """A refusal in a few words: the rule that denied, or the scope that held a script."""
    if (found := re.search(r"rule (\S+) denies ([^:]+):", text)):
        return f"{found[1]} denies {found[2]}"
    if (found := re.search(r"\(tollgate: (scope of rules? [^)]*) does not include", text)):
        return f"script call outside the {found[1]}"
    return text[:80]


def gists(said):
    return "; ".join(f"{step}: " + ", ".join(sorted({gist(t) for t in texts}))
                     for step, texts in said.items())


def refusals_text(refusals):
    lines = ["", "What each refused run was told (first of each kind):"]
    for app, tenant, prefix, said in refusals:
        lines.append(f"  {app} as {tenant}, {prefix}:")
        for step, texts in said.items():
            for text in list(dict.fromkeys(texts))[:3]:
                lines.append(f"    {step}: {text}")
    return "\n".join(lines)


def table(rows):
    lines = [f"{'app':18} {'as':7} {'prefix':14} {'expected':18} {'result':8} {'elapsed':>8}  "
             f"details", "-" * 120]
    for app, tenant, prefix, expected, result, elapsed, figures, reasons in rows:
        lines.append(f"{app:18} {tenant:7} {prefix:14} {expected:18} {result:8} "
                     f"{elapsed:7.1f}s  {figures}")
        for reason in reasons:
            lines.append(f"{'':70}  !! {reason}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tollgate", default="target/release/tollgate",
                        help="the tollgate binary (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=200,
                        help="jobs per BullMQ/Bull run (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="the worker's handlers at once (default: %(default)s)")
    parser.add_argument("--work", help="install and run here (kept; packages reused); default a "
                                       "new temporary directory")
    parser.add_argument("--apps", default="bullmq,bull,limits,lock",
                        help="which apps (default: %(default)s)")
    parser.add_argument("--monitor", action="store_true",
                        help="record MONITOR of the embedded Redis in <work>/monitor.log")
    parser.add_argument("--log-level", default="info", help="the daemon's logging.level")
    parser.add_argument("--acme-only", action="store_true",
                        help="skip the globex runs as globex after acme's")
    parser.add_argument("--no-additions", action="store_true",
                        help="the example as it is (uids only), to see what the apps lack")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("tenant_apps: run as root (it creates and acts as the tenants' users)")
    binary = str(pathlib.Path(args.tollgate).resolve())
    work = pathlib.Path(args.work).resolve() if args.work else pathlib.Path(
        tempfile.mkdtemp(prefix="tollgate-tenant-apps-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)
    users = {tenant: OsUser(name) for tenant, name in TENANTS.items()}
    python = install(work)
    policy_file = work / "tenants.yaml"
    policy_file.write_text(policy(users, not args.no_additions))
    os.chmod(policy_file, 0o644)
    print(f"policy {policy_file}: {EXAMPLE.relative_to(ROOT)} with acme uid {users['acme'].uid}, "
          f"globex uid {users['globex'].uid}, and "
          + ("no additions (--no-additions)" if args.no_additions else "these additions:"))
    for _, before, why in [] if args.no_additions else EXTRA_RULES:
        print(f"  + before rule {before}: {why}")
    daemon = Daemon(binary, work, policy_file, args.log_level)
    if args.monitor:
        daemon.start_monitor(work / "monitor.log")
    runner = Runner(work, python, daemon, users)
    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    try:
        if "bullmq" in apps:
            runner.queue("bullmq", "acme:bull", args.jobs, args.concurrency)
            runner.features("acme:bull")
            runner.queue_refused("bullmq", "globex:bull")
        if "bull" in apps:
            runner.queue("bull", "acme:bull4", args.jobs, args.concurrency)
            runner.queue_refused("bull", "globex:bull4")
        if "limits" in apps:
            runner.limits("acme:limits")
            runner.limits_refused("globex:limits")
        if "lock" in apps:
            runner.lock("acme")
            runner.lock_refused("globex")
        runner.keyspace(["acme"])
        if not args.acme_only:
            # The same apps as globex, with its own prefix: they work there (so the refusals
            # above are of acme, not of the prefix), on the script cache acme filled.
            runner.act_as("globex")
            if "bullmq" in apps:
                runner.queue("bullmq", "globex:bull", max(args.jobs // 4, 10), args.concurrency)
            if "bull" in apps:
                runner.queue("bull", "globex:bull4", max(args.jobs // 4, 10), args.concurrency)
            if "limits" in apps:
                runner.limits("globex:limits")
            if "lock" in apps:
                runner.lock("globex")
            runner.keyspace(["acme", "globex"])
    finally:
        daemon.stop()
    print(table(runner.rows))
    print(refusals_text(runner.refusals))
    print(f"daemon log {daemon.log.name}; runs kept in {work}")
    sys.exit(1 if any(row[4] == "FAIL" for row in runner.rows) else 0)


if __name__ == "__main__":
    main()
