"""`limits` and `python-redis-lock` as a tenant's apps, on a Redis reached by a Unix socket.

Run with the venv tools/compat/tenant_apps.py installs (as the tenant's OS user); each role prints
one JSON line on stdout (and `held` before it, for `lock-hold`).

    apps.py limits       <socket> <prefix> <limit>           every strategy, limit hit exactly
    apps.py lock-hold    <socket> <name> <hold seconds>      hold a lock (renewed past its expiry)
    apps.py lock-wait    <socket> <name> <delay seconds>     contend for it: refused, then waits
    apps.py lock-count   <socket> <name> <counter> <n>       n increments of GET/SET under the lock
    apps.py refused-limits <socket> <prefix>                 what another tenant's prefix is told
    apps.py refused-lock   <socket> <name>

The only tenant-specific setting is the key prefix: `limits`' `key_prefix` (its keys are
`<prefix>:LIMITER/...`) and python-redis-lock's lock name (its keys are `lock:<name>` and
`lock-signal:<name>`; the library fixes the `lock:` part).
"""

import json
import sys
import threading
import time
import traceback

import redis
import redis_lock
from limits import RateLimitItemPerMinute
from limits.storage import storage_from_string
from limits.strategies import (
    FixedWindowRateLimiter,
    MovingWindowRateLimiter,
    SlidingWindowCounterRateLimiter,
)

STRATEGIES = {
    "fixed-window": FixedWindowRateLimiter,
    "moving-window": MovingWindowRateLimiter,
    "sliding-window-counter": SlidingWindowCounterRateLimiter,
}


def emit(result):
    print(json.dumps(result), flush=True)


def storage(socket, prefix):
    # limits' own URI for a Unix socket (it hands `unix://` to redis-py).
    return storage_from_string(f"redis+unix://{socket}", key_prefix=prefix)


def limits(socket, prefix, limit):
    """Per strategy: one caller's hits admitted exactly `limit` times, then refused; and four
    threads hitting one shared identity at once admitted exactly `limit` times in all."""
    store = storage(socket, prefix)
    stamp = f"{time.time_ns()}"
    result = {"ping": store.check(), "strategies": {}}
    for name, strategy in STRATEGIES.items():
        limiter = strategy(store)
        item = RateLimitItemPerMinute(limit)
        # Each strategy keeps its own kind of value (a counter, a list): its own identities.
        caller, shared = (f"{name}-caller", stamp), (f"{name}-shared", stamp)
        one = [limiter.hit(item, *caller) for _ in range(limit + 3)]
        stats = limiter.get_window_stats(item, *caller)
        admitted = []
        lock = threading.Lock()

        def hammer():
            for _ in range(limit):
                ok = limiter.hit(item, *shared)
                with lock:
                    admitted.append(ok)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result["strategies"][name] = {
            "sequence": "".join("1" if ok else "0" for ok in one),
            "test_after": limiter.test(item, *caller),
            "remaining": stats.remaining,
            "concurrent_admitted": sum(admitted),
            "concurrent_tries": len(admitted),
            "key": store.prefixed_key(item.key_for(*caller)),
        }
        # Clearing one's own limit: DEL on its own key.
        limiter.clear(item, *caller)
        result["strategies"][name]["after_clear"] = limiter.hit(item, *caller)
    emit(result)


def client(socket):
    return redis.Redis(unix_socket_path=socket)


def lock_hold(socket, name, hold):
    """Takes the lock with a 1 s expiry renewed in the background, holds it `hold` seconds (past
    the expiry: only the renewal, the library's EXTEND script, keeps it) and releases it."""
    conn = client(socket)
    lock = redis_lock.Lock(conn, name, expire=1, auto_renewal=True)
    acquired = lock.acquire(blocking=True, timeout=10)
    print("held", flush=True)
    taken = time.time()
    time.sleep(hold)
    still_ours = lock.locked() and conn.get(f"lock:{name}") == lock.id.encode()
    released = time.time()
    lock.release()
    emit({"acquired": acquired, "still_ours_at_release": still_ours, "taken": taken,
          "released": released})


def lock_wait(socket, name, delay):
    """Started while the lock is held: after `delay`, a non-blocking try is refused; a blocking one
    waits until the holder releases (woken by the signal list, BLPOP) and gets it."""
    conn = client(socket)
    time.sleep(delay)
    lock = redis_lock.Lock(conn, name, expire=20)
    try_now = lock.acquire(blocking=False)
    started = time.time()
    got = lock.acquire(blocking=True, timeout=15)
    acquired = time.time()
    if got:
        lock.release()
    emit({"try_while_held": try_now, "acquired": got, "waited_from": started,
          "acquired_at": acquired})


def lock_count(socket, name, counter, n):
    """n read-modify-write increments of `counter`, each under the lock: with two such processes
    at once, the counter ends at exactly their sum only if the lock excludes."""
    conn = client(socket)
    contended = 0
    for _ in range(n):
        lock = redis_lock.Lock(conn, name, expire=20)
        if not lock.acquire(blocking=False):
            contended += 1
            lock.acquire(blocking=True, timeout=15)
        value = int(conn.get(counter) or 0)
        time.sleep(0.002)
        conn.set(counter, value + 1)
        lock.release()
    emit({"increments": n, "contended": contended})


def refused(call):
    try:
        outcome = {"result": repr(call())}
    except Exception as error:  # noqa: BLE001 (what the tenant is told, whatever its class)
        outcome = {"error": f"{type(error).__name__}: {error}"}
    return outcome


def refused_limits(socket, prefix):
    store = storage(socket, prefix)
    result = {}
    for name, strategy in STRATEGIES.items():
        limiter = strategy(store)
        result[name] = refused(lambda: limiter.hit(RateLimitItemPerMinute(5), "caller"))
    emit(result)


def refused_lock(socket, name):
    conn = client(socket)
    lock = redis_lock.Lock(conn, name, expire=5)
    result = {"acquire": refused(lambda: lock.acquire(blocking=False))}
    # The release script (EVALSHA with the lock's keys), as if the tenant held it.
    result["release"] = refused(lambda: lock.release())
    result["reset"] = refused(lambda: lock.reset())
    emit(result)


def main():
    role, *args = sys.argv[1:]
    try:
        if role == "limits":
            limits(args[0], args[1], int(args[2]))
        elif role == "lock-hold":
            lock_hold(args[0], args[1], float(args[2]))
        elif role == "lock-wait":
            lock_wait(args[0], args[1], float(args[2]))
        elif role == "lock-count":
            lock_count(args[0], args[1], args[2], int(args[3]))
        elif role == "refused-limits":
            refused_limits(args[0], args[1])
        elif role == "refused-lock":
            refused_lock(args[0], args[1])
        else:
            raise SystemExit(f"unknown role {role}")
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
