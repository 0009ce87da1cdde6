"""Lease pairs as a load: `LEASE ACQUIRE`/`LEASE RELEASE` on Tollgate's RESP socket, or the same two
scripts by EVALSHA (with the keys and arguments the lease service would send) on a forwarding proxy
or Redis itself. Shared by `instructions.py --lease` and `lease_e2e.py`."""

import hashlib
import os
import socket
import threading

LEASE_CLIENTS = 16
LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "lease", "src", "lua")


def lease_script(name):
    """A lease script's source as the lease service sends it: its preludes, then its own file."""
    return "".join(open(os.path.join(LUA, part)).read()
                   for part in ("fence.lua", "shared.lua", f"{name}.lua"))


def resp(*words):
    out = [f"*{len(words)}\r\n".encode()]
    for word in words:
        word = word if isinstance(word, bytes) else str(word).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(word), word))
    return b"".join(out)


def read_reply(stream):
    """Reads one RESP2/RESP3 reply from `stream` (a buffered socket file); raises on an error."""
    line = stream.readline()
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b":", b",", b"#", b"_"):
        return rest
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind in (b"$", b"=", b"!"):
        size = int(rest)
        return None if size < 0 else stream.read(size + 2)[:-2]
    if kind in (b"*", b"~", b">", b"%", b"|"):
        count = int(rest) * (2 if kind in (b"%", b"|") else 1)
        return [read_reply(stream) for _ in range(max(count, 0))]
    raise RuntimeError(f"unexpected reply {line!r}")


def lease_pairs(sock, pairs, shas=None, clients=LEASE_CLIENTS):
    """`pairs` lease pairs from each of `clients` clients on `sock`: `LEASE` calls, or with `shas`
    ((acquire, release) script digests) the same scripts by EVALSHA."""
    errors = []

    def client(number):
        try:
            conn = socket.socket(socket.AF_UNIX)
            conn.connect(sock)
            stream = conn.makefile("rb")
            for i in range(pairs):
                resource, owner, op = f"bench:{number}", f"owner-{number}", f"op-{i}"
                if shas is None:
                    calls = [resp("LEASE", "ACQUIRE", resource, 10000, "OWNER", owner, "OP", op),
                             resp("LEASE", "RELEASE", resource, "OWNER", owner, "OP", op)]
                else:
                    digest = hashlib.sha256(resource.encode()).hexdigest()
                    head = f"tollgate:lease:{{{int(digest[:4], 16) % 1024:03x}}}:"
                    lease, channel = head + digest, head + digest + ":released"
                    calls = [resp("EVALSHA", shas[0], 3, lease, head + "fence", channel, owner, op, 10000),
                             resp("EVALSHA", shas[1], 2, lease, channel, owner, op)]
                for call in calls:
                    conn.sendall(call)
                    read_reply(stream)
            conn.close()
        except Exception as error:  # noqa: BLE001 (reported below, with the client's number)
            errors.append(f"client {number}: {error}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise SystemExit("lease load failed: " + "; ".join(errors[:3]))


def load_scripts(redis_sock):
    """Loads the acquire and release scripts into the run's Redis; returns their digests."""
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(redis_sock)
    stream = conn.makefile("rb")
    shas = []
    for name in ("acquire", "release"):
        conn.sendall(resp("SCRIPT", "LOAD", lease_script(name)))
        shas.append(read_reply(stream).decode())
    conn.close()
    return shas
