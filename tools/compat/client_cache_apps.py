#!/usr/bin/env python3
"""Client libraries' own client-side caches, unchanged, through the daemon's RESP socket (issue 29).

Starts `tollgate serve` as tools/compat/redis_py.py sets it up (allow-all policy, an external
redis-server on a Unix socket with the lane users `tollgate redis-acl` prints), then runs, with
each library's client-side cache switched on in the way its documentation shows and connected to
the daemon's RESP socket (`<runtime>/resp.sock`):

1. node-redis (npm `redis` 5.x, `clientSideCache` over RESP3), checks 1a-1h;
2. redis-py (PyPI `redis`, `cache_config=CacheConfig()` over RESP3), checks 2a-2d, when the
   redis-server is 7.4 or later (redis-py refuses an older one, directly as through the daemon,
   whose HELLO repeats Redis's own server and version):

   a. GET k twice: the second read is served by the cache, and Redis was asked once;
   b. k SET straight on redis-server (behind the daemon's back): the cached client reads the new
      value within DEADLINE_S (its cache was told, or it would answer the old value forever);
   c. k SET by a second, uncached client of the daemon: likewise;
   d. the cached client's own SET, then GET: the new value at once, ROUNDS times in a row;
   e, f. (node-redis) HGETALL twice, from the cache the second time (as a); then a field changed
      on redis-server: the cached HGETALL sees it (as b);
   g, h. (node-redis) MGET of two keys, likewise; then one of the two changed.

"Redis was asked" is read from redis-server's own `INFO commandstats` over a direct connection,
which is also the only client that bypasses the daemon. Each check prints what it saw; a library's
summary line is `<library> <version>: N checks passed`. Exits 0 only when every check passes.

Not a CI test: needs node and npm (installed with apt-get when missing), /usr/bin/python3 with
venv, redis-server, redis-cli and curl, and downloads the pinned packages below from npm and PyPI
into a temporary directory (or --work, kept and reused):

    python3 tools/compat/client_cache_apps.py [--tollgate PATH] [--work DIR]
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import redis_py  # noqa: E402  (the redis-server and Tollgate set-up, log, wait_for)

# node-redis 5.12.1 is the last 5.x. redis-py 8.2.0 is the first release whose cache works over a
# Unix socket: before it `Redis(unix_socket_path=…, cache_config=…)` drops the cache silently
# (it is passed on only for TCP), and a pool built by hand fails in CacheProxyConnection
# (`'UnixDomainSocketConnection' object has no attribute 'host'`, 6.x to 8.1).
NPM_PACKAGE = "redis@5.12.1"
PY_PACKAGE = "redis==8.2.0"
SYSTEM_PYTHON = "/usr/bin/python3"
# How long a cached client may keep answering a value that changed (an invalidation crosses two
# connections: Redis -> daemon -> client), and how often the read-your-writes round repeats (a
# reply and the invalidation after it reaching the client in two reads is a race, not a certainty).
DEADLINE_S = 5
ROUNDS = 50
APP_TIMEOUT_S = 120

# -- the node-redis app ----------------------------------------------------------------------------
# Prints one JSON line per check ({"check", "title", "ok", "seen"}) and a first {"version"} line.
NODE_APP = r"""
import { createRequire } from 'node:module';
import { createClient } from 'redis';

const require = createRequire(import.meta.url);
const [daemonSocket, redisSocket, prefix, deadlineS, roundsArg] = process.argv.slice(2);
const DEADLINE_MS = Number(deadlineS) * 1000;
const ROUNDS = Number(roundsArg);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const emit = (record) => console.log(JSON.stringify(record));

emit({ version: require('redis/package.json').version });

// The cached client, as node-redis's README shows it, on the daemon's socket.
const cached = createClient({
  socket: { path: daemonSocket },
  RESP: 3,
  clientSideCache: { ttl: 0, maxEntries: 0 },
});
// A second client of the daemon, without a cache (RESP2, node-redis's default).
const other = createClient({ socket: { path: daemonSocket } });
// Straight to redis-server: writes behind the daemon's back, and Redis's own command counts.
const direct = createClient({ socket: { path: redisSocket } });
for (const client of [cached, other, direct]) {
  client.on('error', (error) => console.error(`client error: ${error}`));
  await client.connect();
}
const cache = cached.clientSideCache;

// Every invalidation the cache was told of (null: everything).
const invalidated = [];
cache.on('invalidate', (key) => invalidated.push(key === null ? null : key.toString()));

function stats() {
  const s = cache.stats();
  return { hits: s.hitCount, misses: s.missCount };
}

async function calls(command) {
  const info = await direct.info('commandstats');
  const found = info.match(new RegExp(`cmdstat_${command}:calls=(\\d+)`));
  return found ? Number(found[1]) : 0;
}

// Reads until `want` comes back or the deadline passes (never a fixed sleep): what was seen.
async function readUntil(read, want) {
  const started = performance.now();
  let reads = 0;
  let last;
  while (performance.now() - started < DEADLINE_MS) {
    last = await read();
    reads += 1;
    if (same(last, want)) break;
    await sleep(10);
  }
  return { reached: same(last, want), ms: Math.round(performance.now() - started), reads, last };
}

// a-style: read twice, the second from the cache, Redis asked once.
async function readTwice(check, title, command, read, want) {
  const before = stats();
  const callsBefore = await calls(command);
  const first = await read();
  const second = await read();
  const after = stats();
  const asked = (await calls(command)) - callsBefore;
  const hits = after.hits - before.hits;
  const misses = after.misses - before.misses;
  const ok = same(first, want) && same(second, want) && hits === 1 && misses === 1 && asked === 1;
  emit({ check, title, ok, seen: { first, second, cacheHits: hits, cacheMisses: misses,
                                   redisAsked: asked, want } });
  return ok;
}

// b/c-style: after `change`, reads through the cache until the new value, which must come, and
// the cache must have been told of `key`.
async function changedBehind(check, title, key, change, read, want) {
  // First the old value is in the cache (a hit), so that a new one can only come by invalidation.
  const hitsWarm = stats().hits;
  const old = await read();
  const cachedBefore = stats().hits - hitsWarm === 1;
  const told = invalidated.length;
  const before = stats();
  await change();
  const seen = await readUntil(read, want);
  const tolds = invalidated.slice(told);
  const toldOfKey = tolds.some((k) => k === key || k === null);
  // Cached again: one more read is a hit with the new value.
  const hitsBefore = stats().hits;
  const again = await read();
  const hitAgain = stats().hits - hitsBefore === 1 && same(again, want);
  const ok = cachedBefore && seen.reached && toldOfKey && hitAgain;
  emit({ check, title, ok, seen: { cachedBefore: old, wasHit: cachedBefore, ...seen, want,
                                   invalidations: tolds,
                                   missesWhileWaiting: stats().misses - before.misses,
                                   cachedAgain: hitAgain } });
  return ok;
}

const k = `${prefix}:k`;
const h = `${prefix}:h`;
const m1 = `${prefix}:m1`;
const m2 = `${prefix}:m2`;
const get = () => cached.get(k);
try {
  await direct.set(k, 'v1');
  await readTwice('a', 'GET twice: the second from the cache, Redis asked once', 'get', get, 'v1');
  await changedBehind('b', 'SET on redis-server behind the daemon: the cached GET sees it', k,
                      () => direct.set(k, 'v2'), get, 'v2');
  await changedBehind('c', "SET by another client of the daemon: the cached GET sees it", k,
                      () => other.set(k, 'v3'), get, 'v3');

  // d: the cached client's own write, then a read: the new value at once, every round.
  const stale = [];
  for (let round = 0; round < ROUNDS; round += 1) {
    const value = `own-${round}`;
    await get(); // cached (a hit from the second round on)
    await cached.set(k, value);
    const read = await get();
    if (read !== value) stale.push({ round, wrote: value, read });
  }
  emit({ check: 'd', title: `own SET then GET: the new value at once (${ROUNDS} rounds)`,
         ok: stale.length === 0, seen: { rounds: ROUNDS, staleReads: stale.length,
                                         firstStale: stale.slice(0, 3) } });

  // e, f: a hash, read whole.
  await direct.hSet(h, { f1: 'x1', f2: 'y' });
  const hgetall = () => cached.hGetAll(h);
  await readTwice('e', 'HGETALL twice: the second from the cache', 'hgetall', hgetall,
                  { f1: 'x1', f2: 'y' });
  await changedBehind('f', 'HSET on redis-server: the cached HGETALL sees it', h,
                      () => direct.hSet(h, 'f1', 'x2'), hgetall, { f1: 'x2', f2: 'y' });

  // g, h: MGET caches one entry for two keys; a change of either drops it.
  await direct.mSet({ [m1]: 'a1', [m2]: 'b1' });
  const mget = () => cached.mGet([m1, m2]);
  await readTwice('g', 'MGET twice: the second from the cache', 'mget', mget, ['a1', 'b1']);
  await changedBehind('h', "SET of MGET's second key on redis-server: the cached MGET sees it",
                      m2, () => direct.set(m2, 'b2'), mget, ['a1', 'b2']);
} catch (error) {
  emit({ check: 'error', title: 'the app stopped', ok: false, seen: String(error.stack || error) });
} finally {
  await direct.del([k, h, m1, m2]).catch(() => {});
  for (const client of [cached, other, direct]) client.destroy();
}
"""

# -- the redis-py app ------------------------------------------------------------------------------
PY_APP = r'''
import json
import sys
import time

import redis
from redis.cache import CacheConfig

daemon_socket, redis_socket, prefix, deadline_s, rounds = sys.argv[1:6]
DEADLINE_S, ROUNDS = float(deadline_s), int(rounds)


def emit(**record):
    print(json.dumps(record, default=repr), flush=True)


emit(version=redis.__version__)
# The cached client, as redis-py's documentation shows it, on the daemon's socket.
cached = redis.Redis(unix_socket_path=daemon_socket, protocol=3, cache_config=CacheConfig(),
                     decode_responses=True)
# A second client of the daemon, without a cache; one straight to redis-server.
other = redis.Redis(unix_socket_path=daemon_socket, decode_responses=True)
direct = redis.Redis(unix_socket_path=redis_socket, decode_responses=True)
k = f"{prefix}:k"


def calls(command):
    return direct.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def cached_values(key):
    """What the cache holds for `key`: the values of its entries (redis-py has no stats)."""
    cache = cached.get_cache()
    return [entry.cache_value for cache_key, entry in list(cache.collection.items())
            if key in [k.decode() if isinstance(k, bytes) else k for k in cache_key.redis_keys]]


def read_until(want):
    """Reads until `want` comes back or the deadline passes (never a fixed sleep)."""
    started = time.monotonic()
    reads, last = 0, None
    while time.monotonic() - started < DEADLINE_S:
        last = cached.get(k)
        reads += 1
        if last == want:
            break
        time.sleep(0.01)
    return {"reached": last == want, "ms": round((time.monotonic() - started) * 1000),
            "reads": reads, "last": last}


def changed_behind(check, title, change, want):
    # First the old value is in the cache, so that a new one can only come by invalidation.
    cached_before = cached_values(k)
    asked_before = calls("get")
    change()
    seen = read_until(want)
    # The new value came from Redis (the cache dropped the old one), and is cached again: one more
    # read does not reach Redis.
    asked = calls("get") - asked_before
    again = cached.get(k)
    asked_again = calls("get") - asked_before - asked
    ok = len(cached_before) == 1 and seen["reached"] and asked >= 1 and again == want \
        and asked_again == 0
    emit(check=check, title=title, ok=ok,
         seen=dict(seen, cached_before=cached_before, want=want, redis_asked=asked,
                   cached_again=cached_values(k), redis_asked_after=asked_again))


try:
    try:
        cached.ping()
    except redis.ConnectionError as error:
        # redis-py checks the server's HELLO before it enables its cache (CacheProxyConnection:
        # `server` must be "redis", `version` 7.4 or later): say what the daemon told it.
        plain = redis.Redis(unix_socket_path=daemon_socket, protocol=3, decode_responses=True)
        hello = plain.execute_command("HELLO", "3")
        told = {key: hello.get(key) for key in ("server", "version")}
        emit(check="connect", title="connect with the cache on", ok=False,
             seen={"error": f"{type(error).__name__}: {error}", "daemon_hello_3": told})
        sys.exit(0)

    direct.set(k, "v1")
    before = calls("get")
    first, second = cached.get(k), cached.get(k)
    asked = calls("get") - before
    emit(check="a", title="GET twice: the second from the cache, Redis asked once",
         ok=first == second == "v1" and asked == 1 and cached_values(k) == ["v1"],
         seen={"first": first, "second": second, "redis_asked": asked,
               "cached": cached_values(k)})
    changed_behind("b", "SET on redis-server behind the daemon: the cached GET sees it",
                   lambda: direct.set(k, "v2"), "v2")
    changed_behind("c", "SET by another client of the daemon: the cached GET sees it",
                   lambda: other.set(k, "v3"), "v3")
    stale = []
    for round in range(ROUNDS):
        value = f"own-{round}"
        cached.get(k)
        cached.set(k, value)
        read = cached.get(k)
        if read != value:
            stale.append({"round": round, "wrote": value, "read": read})
    emit(check="d", title=f"own SET then GET: the new value at once ({ROUNDS} rounds)",
         ok=not stale, seen={"rounds": ROUNDS, "stale_reads": len(stale),
                             "first_stale": stale[:3]})
except Exception as error:  # noqa: BLE001  (reported as a failed check, with what was seen)
    emit(check="error", title="the app stopped", ok=False, seen=f"{type(error).__name__}: {error}")
finally:
    direct.delete(k)
'''

# Each library's number in the output and the checks its app reports, in order.
LIBRARIES = {
    "node-redis": ("1", ["a", "b", "c", "d", "e", "f", "g", "h"]),
    "redis-py": ("2", ["a", "b", "c", "d"]),
}


def ensure_node():
    """node and npm from Debian when the machine has none."""
    if shutil.which("node") and shutil.which("npm"):
        return
    redis_py.log("node/npm missing: apt-get install nodejs npm")
    subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "nodejs", "npm"], check=True,
                   stdout=subprocess.DEVNULL)


def install(work):
    """node_modules and a venv in `work`, with the apps beside them; reused when already there."""
    ensure_node()
    if not (work / "node_modules" / "redis" / "package.json").is_file():
        redis_py.log(f"npm install {NPM_PACKAGE}")
        with open(work / "npm.log", "w") as out:
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(work),
                            NPM_PACKAGE], stdout=out, stderr=subprocess.STDOUT, check=True)
    python = work / "venv" / "bin" / "python"
    if not python.exists():
        redis_py.log(f"venv ({SYSTEM_PYTHON}) with {PY_PACKAGE}")
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(work / "venv")], check=True)
        with open(work / "pip.log", "w") as out:
            subprocess.run([str(python), "-m", "pip", "install", PY_PACKAGE], stdout=out,
                           stderr=subprocess.STDOUT, check=True)
    # The node app beside node_modules, so that `import 'redis'` finds the installed one.
    (work / "cache_app.mjs").write_text(NODE_APP)
    (work / "cache_app.py").write_text(PY_APP)
    return python


def run_app(argv, work):
    """The app's version and its check records, and its stderr."""
    try:
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True,
                              timeout=APP_TIMEOUT_S)
        out, err = done.stdout, done.stderr + (f"\n(exit {done.returncode})"
                                                 if done.returncode else "")
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        err = f"timed out after {APP_TIMEOUT_S} s"
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    version = next((r["version"] for r in records if "version" in r), "?")
    return version, [r for r in records if "check" in r], err


def report(library, number, expected, version, records, stderr):
    """Prints the library's checks and its summary line; True when every expected check passed.

    Records other than the numbered checks (`connect`: the cache could not be switched on;
    `error`: the app stopped) are failures printed under their name, before the checks not run."""
    print(f"{library} {version}")
    for record in records:
        label = number + record["check"] if record["check"] in expected else \
            f"{number} {record['check']}"
        print(f"  {label} {'pass' if record['ok'] else 'FAIL'}  {record['title']}")
        # What was seen: in full for a failure (loudly), briefly for a pass.
        seen = json.dumps(record["seen"], ensure_ascii=False)
        print(f"       seen: {seen if not record['ok'] else seen[:300]}")
    passed = [r["check"] for r in records if r["ok"] and r["check"] in expected]
    failed = [r["check"] for r in records if not r["ok"]]
    not_run = [check for check in expected if check not in passed + failed]
    if stderr.strip() and (failed or not_run):
        print("  stderr: " + stderr.strip()[-2000:].replace("\n", "\n          "))
    if not failed and not not_run:
        print(f"{library} {version}: {len(passed)} checks passed")
        return True
    def named(checks):
        return ", ".join(number + c if c in expected else c for c in checks)

    print(f"{library} {version}: {len(passed)} checks passed, FAILED: {named(failed)}"
          + (f"; not run: {named(not_run)}" if not_run else ""))
    return False


def version_tuple(version):
    """`7.0.15` as (7, 0, 15)."""
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def hello(resp):
    """The daemon's `HELLO 3` server and version, as a client library reads them."""
    out = subprocess.run(["redis-cli", "-3", "-s", str(resp), "HELLO", "3"], capture_output=True,
                         text=True).stdout.split()
    pairs = dict(zip(out[0::2], out[1::2]))
    return f"server={pairs.get('server')} version={pairs.get('version')}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tollgate", default="target/release/tollgate",
                        help="the tollgate binary (default: %(default)s)")
    parser.add_argument("--work", help="install and run here (kept; packages reused); default a "
                                       "new temporary directory")
    args = parser.parse_args()
    binary = str(pathlib.Path(args.tollgate).resolve())
    work = pathlib.Path(args.work).resolve() if args.work else pathlib.Path(
        tempfile.mkdtemp(prefix="tollgate-client-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    python = install(work)
    daemon_dir = pathlib.Path(tempfile.mkdtemp(prefix="daemon-", dir=work))
    daemon = redis_py.Tollgate(binary, daemon_dir, "readme")
    redis_socket = daemon_dir / "redis.sock"
    prefix = f"client-cache-{int(time.time())}"
    common = [str(daemon.resp), str(redis_socket)]
    tail = [str(DEADLINE_S), str(ROUNDS)]
    apps = {
        "node-redis": ["node", str(work / "cache_app.mjs")] + common + [f"{prefix}:node"] + tail,
        "redis-py": [str(python), str(work / "cache_app.py")] + common + [f"{prefix}:py"] + tail,
    }
    results = []
    try:
        redis_version = daemon.redis.cli("INFO", "server").split("redis_version:")[1].split()[0]
        print(f"tollgate {binary} (HELLO 3: {hello(daemon.resp)}) on redis-server "
              f"{redis_version}; clients on {daemon.resp}")
        for library, (number, expected) in LIBRARIES.items():
            if library == "redis-py" and version_tuple(redis_version) < (7, 4):
                # redis-py enables its cache only for a server whose HELLO says `redis` 7.4 or
                # later; the daemon's HELLO repeats Redis's own, so it refuses this redis-server
                # through the daemon exactly as it does directly.
                print(f"redis-py: skipped: its client-side cache needs Redis 7.4 or later, and "
                      f"this redis-server is {redis_version} (refused directly too)")
                continue
            version, checks, stderr = run_app(apps[library], work)
            results.append(report(library, number, expected, version, checks, stderr))
    finally:
        daemon.stop()
        # The lane users' passwords; the rest (the daemon's log above all) is kept for reading.
        shutil.rmtree(daemon_dir / "acl", ignore_errors=True)
    print(f"daemon log {daemon.log.name}; runs kept in {work}")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
