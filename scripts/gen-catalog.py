#!/usr/bin/env python3
"""Generates the built-in catalog's command table from a live Redis server.

Reads COMMAND INFO (arity, flags, ACL categories, key specs, subcommands) and COMMAND DOCS (summaries)
through redis-cli, decides each command's lane by the rules in docs/design.md ("Lanes"), and writes
policies/modules/catalog/src/commands.rs, which is committed as data and snapshot-tested.

Usage: scripts/gen-catalog.py [--socket PATH]
Without --socket it starts a private redis-server on a temporary Unix socket and stops it afterwards.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "policies", "modules", "catalog", "src", "commands.rs")

CATEGORIES = [
    "keyspace", "read", "write", "set", "sortedset", "list", "hash", "string", "bitmap",
    "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow", "blocking", "dangerous",
    "connection", "transaction", "scripting",
]
TRAITS = ["write", "readonly", "admin", "blocking", "dangerous", "pubsub", "scripting", "transaction"]
TRANSACTION = {"multi", "exec", "discard", "watch", "unwatch"}
SCRIPT = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro", "script", "function"}
PUBSUB = {"subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe"}
# Blocking although Redis does not flag them so: they hold the connection until replicas answer.
ALWAYS_BLOCKING = {"wait", "waitaof"}
# Flagged blocking, but they block only when this keyword is present.
BLOCKS_WITH_KEYWORD = {"xread": "BLOCK", "xreadgroup": "BLOCK"}
# Key specs Redis marks `unknown`: keys follow these keywords from argv[2] on (SORT ... BY p GET p
# STORE dst). Redis names only the last STORE and no BY or GET pattern (they reach keys it cannot
# name); every one counts here, the stricter answer.
KEYS_AFTER_KEYWORDS = {
    "sort": [(["BY", "GET"], True, False), (["STORE"], False, True)],
    "sort_ro": [(["BY", "GET"], True, False)],
}
# Keyword specs whose command takes the LAST occurrence while the spec (and so COMMAND GETKEYS)
# names the first: every occurrence counts (GEORADIUS ... STORE a STORE b stores to b).
EVERY_KEYWORD = {"georadius", "georadiusbymember"}
# Commands whose key specs are incomplete or whose flags vary with the call: Redis finds their keys
# with a procedure of its own (db.c), which table.rs's `Parse` follows. Replaces their key specs;
# `None` keeps them (XREAD's are kept alongside, the stricter union).
RANGE1 = "Find::Range { last: 0, step: 1, limit: 0 }"
PARSED_KEYS = {
    "migrate": [
        (True, True, "Begin::Parsed(Parse::MigrateKey)", RANGE1),
        (True, True, "Begin::Parsed(Parse::MigrateKeys)", "Find::Range { last: -1, step: 1, limit: 0 }"),
    ],
    "set": [
        (False, True, "Begin::Index(1)", RANGE1),
        (True, False, "Begin::Parsed(Parse::SetGet)", RANGE1),
    ],
    "bitfield": [
        (True, False, "Begin::Index(1)", RANGE1),
        (False, True, "Begin::Parsed(Parse::BitfieldWrite)", RANGE1),
    ],
    "xread": [None, (True, False, "Begin::Parsed(Parse::Streams)", "Find::Range { last: -1, step: 1, limit: 2 }")],
    "xreadgroup": [None, (True, False, "Begin::Parsed(Parse::Streams)", "Find::Range { last: -1, step: 1, limit: 2 }")],
}


def redis_cli(socket, *args):
    return subprocess.run(
        ["redis-cli", "-s", socket, "-3", *args], check=True, capture_output=True, text=True
    ).stdout


def redis_json(socket, *args):
    return json.loads(redis_cli(socket, "--json", *args))


def start_server(tmp):
    socket = os.path.join(tmp, "redis.sock")
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", socket, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(100):
        if os.path.exists(socket):
            return proc, socket
        time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not open its socket")


def parent_name(name):
    return name.split("|")[0]


def lane(name, flags, categories):
    parent = parent_name(name)
    if parent in TRANSACTION:
        return "Transaction"
    if parent in SCRIPT:
        return "Script"
    if parent in PUBSUB:
        return "Pubsub"
    if "blocking" in flags or parent in ALWAYS_BLOCKING:
        return "Blocking"
    adminish = "admin" in flags or "@admin" in categories or "@dangerous" in categories
    touches_keys = "write" in flags or "@keyspace" in categories or "@read" in categories or "@write" in categories
    if adminish and not touches_keys:
        return "Admin"
    return "Regular"


def mask(names, chosen):
    return sum(1 << i for i, n in enumerate(names) if n in chosen)


def key_access(flags):
    read = any(f in flags for f in ("RO", "RW", "access"))
    write = any(f in flags for f in ("RW", "OW", "RM", "update", "insert", "delete"))
    return read, write


def key_spec_rs(read, write, begin, find):
    return f"KeySpec {{ read: {str(read).lower()}, write: {str(write).lower()}, begin: {begin}, find: {find} }}"


def spec_rs(name, spec):
    read, write = key_access(spec["flags"])
    begin, find = spec["begin_search"], spec["find_keys"]
    if begin["type"] == "index":
        b = f"Begin::Index({begin['spec']['index']})"
    elif begin["type"] == "keyword" and name in EVERY_KEYWORD:
        b = f"Begin::AfterEach(&[{json.dumps(begin['spec']['keyword'])}], {begin['spec']['startfrom']})"
    elif begin["type"] == "keyword":
        b = f"Begin::Keyword({json.dumps(begin['spec']['keyword'])}, {begin['spec']['startfrom']})"
    else:
        return None
    if find["type"] == "range":
        s = find["spec"]
        f = f"Find::Range {{ last: {s['lastkey']}, step: {s['keystep']}, limit: {s['limit']} }}"
    elif find["type"] == "keynum":
        s = find["spec"]
        f = f"Find::Keynum {{ index: {s['keynumidx']}, first: {s['firstkey']}, step: {s['keystep']} }}"
    else:
        return None
    return key_spec_rs(read, write, b, f)


def entry_rs(info, docs, indent):
    name, arity, flags, categories = info[0], info[1], info[2], info[6]
    specs = [s for s in (spec_rs(name, spec) for spec in info[8]) if s]
    if name in PARSED_KEYS:
        parsed = [key_spec_rs(*p) for p in PARSED_KEYS[name] if p]
        specs = (specs if None in PARSED_KEYS[name] else []) + parsed
    for keywords, read, write in KEYS_AFTER_KEYWORDS.get(name, []):
        kws = ", ".join(json.dumps(k) for k in keywords)
        specs.append(key_spec_rs(read, write, f"Begin::AfterEach(&[{kws}], 2)", RANGE1))
    cats = [c.lstrip("@") for c in categories]
    traits = set(f for f in flags if f in ("write", "readonly", "admin", "blocking", "pubsub"))
    traits |= {c for c in ("dangerous", "scripting", "transaction", "pubsub") if c in cats}
    subs = sorted(info[9], key=lambda s: s[0])
    pad = " " * indent
    summary = docs.get(name, {}).get("summary", "").strip()
    block_kw = BLOCKS_WITH_KEYWORD.get(name)
    lines = [
        f"{pad}// {summary}" if summary else None,
        f"{pad}Entry {{",
        f"{pad}    name: {json.dumps(name.upper())},",
        f"{pad}    arity: {arity},",
        f"{pad}    lane: Lane::{lane(name, flags, categories)},",
        f"{pad}    blocks_only_with: {('Some(' + json.dumps(block_kw) + ')') if block_kw else 'None'},",
        f"{pad}    categories: {mask(CATEGORIES, cats):#x}, // {' '.join('@' + c for c in cats)}",
        f"{pad}    traits: {mask(TRAITS, traits):#x}, // {' '.join(t for t in TRAITS if t in traits)}",
        f"{pad}    keys: &[{', '.join(specs)}],",
    ]
    if subs:
        sub_docs = docs.get(name, {}).get("subcommands", {})
        lines.append(f"{pad}    subcommands: &[")
        lines += [entry_rs(sub, sub_docs, indent + 8) for sub in subs]
        lines.append(f"{pad}    ],")
    else:
        lines.append(f"{pad}    subcommands: &[],")
    lines.append(f"{pad}}},")
    return "\n".join(line.rstrip() for line in lines if line is not None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help="a running server's Unix socket (default: start one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        socket = args.socket
        if socket is None:
            proc, socket = start_server(tmp)
        try:
            version = redis_cli(socket, "INFO", "server")
            info = redis_json(socket, "COMMAND", "INFO")
            docs = redis_json(socket, "COMMAND", "DOCS")
        finally:
            if proc:
                proc.kill()
                proc.wait()
    redis_version = next(
        line.split(":", 1)[1].strip() for line in version.splitlines() if line.startswith("redis_version:")
    )
    entries = sorted(info, key=lambda c: c[0])
    body = "\n".join(entry_rs(c, docs, 4) for c in entries)
    with open(OUT, "w") as out:
        out.write(
            "//! GENERATED by scripts/gen-catalog.py from COMMAND INFO and COMMAND DOCS of Redis "
            f"{redis_version}. Do not edit:\n"
            "//! regenerate, then review the catalog snapshot diff.\n\n"
            "use crate::table::{Begin, Entry, Find, KeySpec, Lane, Parse};\n\n"
            "/// Every command, sorted by name; subcommands sorted within their parent.\n"
            f"pub static COMMANDS: &[Entry] = &[\n{body}\n];\n"
        )
    print(f"wrote {os.path.relpath(OUT, ROOT)}: {len(entries)} commands (Redis {redis_version})")


if __name__ == "__main__":
    main()
