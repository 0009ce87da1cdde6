#!/usr/bin/env python3
"""File-level import cycles in the workspace's Rust crates.

A file A depends on a file B when A names an item (type, function, constant, trait, macro) that is
*defined* in B: through `use crate::…`, `use super::…`, `use self::…` or a path written inline in the
code. Re-exports (`pub use`) are followed to the file that defines the item and are not themselves
dependencies, and `mod` declarations are not dependencies: a parent that only declares and
re-exports its children does not depend on them. Tests (`#[cfg(test)] mod tests` blocks and
`tests.rs` files) are left out, since a test may reach into whatever it checks.

Prints every strongly connected component of more than one file, with one cycle through it, and
exits 1 if there is any. Usage: `python3 tools/import_cycles.py [crate-src-dir ...]` (default: every
`src/` of the workspace members).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCES = [
    "src",
    "daemon/src",
    "crates/resp/src",
    "crates/lanes/src",
    "crates/policy/src",
    "crates/policy-rules/src",
    "crates/lease/src",
    "crates/lease-api/src",
    "crates/lease-client/src",
    "crates/model/src",
    "crates/testkit/src",
]

ITEM = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:(?:async|const|unsafe|extern\s+\"C\")\s+)*"
    r"(?:struct|enum|fn|trait|type|const|static|union|mod)\s+(\w+)",
    re.M,
)
MACRO = re.compile(r"^\s*macro_rules!\s*(\w+)", re.M)
USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
INLINE = re.compile(r"\b((?:crate|super|self)(?:::\w+)+)")
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)


def strip_tests(text: str) -> str:
    """Removes `#[cfg(test)]` items (a `mod tests { … }` block or a `mod tests;` line)."""
    out, i = [], 0
    for match in re.finditer(r"#\[cfg\(test\)\]\s*", text):
        if match.start() < i:
            continue
        out.append(text[i : match.start()])
        j = match.end()
        semi, brace = text.find(";", j), text.find("{", j)
        if brace == -1 or (semi != -1 and semi < brace):
            i = semi + 1
            continue
        depth, k = 0, brace
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1
    out.append(text[i:])
    return "".join(out)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def expand_use(tree: str) -> list[tuple[list[str], str]]:
    """`a::{b, c::{d@AS@e}}` → [(['a','b'],'b'), (['a','c','d'],'e')]; `self` in braces is the prefix.

    `as` has been written `@AS@` by the caller so that removing whitespace keeps it apart."""
    tree = re.sub(r"\s+", "", tree)

    def walk(prefix: list[str], part: str):
        if "{" not in part:
            path, _, alias = part.partition("@AS@")
            segs = [s for s in path.split("::") if s]
            if segs and segs[-1] == "self":
                segs = segs[:-1]
            if segs:
                yield prefix + segs, alias or segs[-1]
            return
        head, rest = part.split("{", 1)
        rest = rest[: rest.rfind("}")]
        head_segs = [s for s in head.split("::") if s]
        depth, start = 0, 0
        for k, ch in enumerate(rest + ","):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                piece = rest[start:k]
                start = k + 1
                if piece:
                    yield from walk(prefix + head_segs, piece)

    return list(walk([], tree))


class Module:
    def __init__(self, path: Path, modpath: list[str], text: str):
        self.path = path
        self.modpath = modpath
        self.text = strip_comments(strip_tests(text))
        self.defined = set(ITEM.findall(self.text)) | set(MACRO.findall(self.text))
        self.children = set(MOD_DECL.findall(self.text))
        self.reexports: dict[str, list[str]] = {}
        self.uses: list[list[str]] = []
        for match in USE.finditer(re.sub(r"\s+as\s+", "@AS@", self.text)):
            public, tree = match.group(1), match.group(2)
            for segs, name in expand_use(tree):
                if public:
                    self.reexports[name] = segs
                else:
                    self.uses.append(segs)
        for match in INLINE.finditer(USE.sub("", self.text)):
            self.uses.append(match.group(1).split("::"))


def load(src: Path) -> dict[tuple[str, ...], Module]:
    modules: dict[tuple[str, ...], Module] = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] in ("lib", "main") and len(parts) == 1:
            parts = []
        elif parts[-1] == "mod":
            parts = parts[:-1]
        if parts and parts[-1] == "tests":
            continue
        if "bin" in rel.parts:
            continue
        modules[tuple(parts)] = Module(path, parts, path.read_text())
    return modules


def absolute(module: Module, segs: list[str]) -> list[str] | None:
    if not segs:
        return None
    if segs[0] == "crate":
        return segs[1:]
    here = list(module.modpath)
    out = list(segs)
    if out[0] == "self":
        return here + out[1:]
    if out[0] in module.children:
        # A 2018-edition `use child::Item` names the current module's own child.
        return here + out
    while out and out[0] == "super":
        if not here:
            return None
        here = here[:-1]
        out = out[1:]
    return here + out if segs[0] == "super" else None


def resolve(modules, segs: list[str], seen=None) -> tuple[str, ...] | None:
    """The module that defines the item `segs` names (following `pub use`), or the module itself."""
    seen = seen or set()
    key = tuple(segs)
    if key in seen:
        return None
    seen.add(key)
    if key in modules:
        return key
    for cut in range(len(segs) - 1, -1, -1):
        owner = tuple(segs[:cut])
        if owner not in modules:
            continue
        name = segs[cut]
        module = modules[owner]
        if name in module.defined and tuple(segs[: cut + 1]) not in modules:
            return owner
        if name in module.reexports:
            target = absolute(module, module.reexports[name])
            if target is not None:
                return resolve(modules, target + segs[cut + 1 :], seen)
        return owner
    return None


def graph(modules):
    edges: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in modules}
    for key, module in modules.items():
        for segs in module.uses:
            target = absolute(module, segs)
            if target is None:
                continue
            owner = resolve(modules, target)
            if owner is None or owner == key:
                continue
            # Naming a child module itself (`use self::child;`) is the parent's own structure.
            if list(owner) == target and owner[:-1] == key:
                continue
            edges[key].add(owner)
    return edges


def components(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            strong(v)
    return [c for c in out if len(c) > 1]


def one_cycle(edges, comp):
    members = set(comp)
    start = sorted(comp)[0]
    path, seen = [start], {start}

    def dfs(v):
        for w in sorted(edges[v]):
            if w == start and len(path) > 1:
                return True
            if w in members and w not in seen:
                seen.add(w)
                path.append(w)
                if dfs(w):
                    return True
                path.pop()
        return False

    dfs(start)
    return path + [start]


def main(argv: list[str]) -> int:
    sources = [ROOT / s for s in (argv or DEFAULT_SOURCES)]
    found = 0
    for src in sources:
        if not src.is_dir():
            continue
        modules = load(src)
        edges = graph(modules)
        for comp in components(edges):
            found += 1
            cycle = one_cycle(edges, comp)
            names = [str(modules[m].path.relative_to(ROOT)) for m in cycle]
            print(f"cycle ({len(comp)} files): " + " -> ".join(names))
    if found == 0:
        print(f"no file-level import cycles in {len([s for s in sources if s.is_dir()])} crates")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
