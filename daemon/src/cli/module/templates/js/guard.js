// A guard module: every key must start with the caller's principal and a separator
// (`config.get()`, `:` when empty). It abstains, or denies.
// Built by `tollgate module build` with componentize-qjs (QuickJS), every WASI import stubbed out:
// no clock, randomness, console or files. QuickJS has no TextEncoder/TextDecoder either.
import config from "tollgate:policy/config";

// Numbers per argument in argv.spans: where it ends in bytes, its full length, its access as a
// key (0: not a key). See wit/policy.wit.
const SPAN = 3;
let separator = null;

function utf8(s) {
  const out = [];
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return Uint8Array.from(out);
}

function text(bytes) {
  let escaped = "";
  for (const b of bytes) escaped += "%" + b.toString(16).padStart(2, "0");
  try {
    return decodeURIComponent(escaped);
  } catch {
    return Array.from(bytes, (b) => (b < 0x80 ? String.fromCharCode(b) : "\ufffd")).join("");
  }
}

// The caller's principal followed by the separator. Config bytes never change during an
// instance's life, so they are read once.
function prefixOf(who) {
  if (separator === null) {
    const configured = config.get();
    separator = configured.length === 0 ? utf8(":") : Uint8Array.from(configured);
  }
  const principal = utf8(who.principal);
  const prefix = new Uint8Array(principal.length + separator.length);
  prefix.set(principal);
  prefix.set(separator, principal.length);
  return prefix;
}

function startsWith(bytes, start, end, prefix) {
  if (end - start < prefix.length) return false;
  for (let i = 0; i < prefix.length; i++) if (bytes[start + i] !== prefix[i]) return false;
  return true;
}

// Judges arguments first .. first + count of a packed argv.
function judge(prefix, bytes, spans, first, count) {
  for (let i = first; i < first + count; i++) {
    if (spans[SPAN * i + 2] === 0) continue;
    const start = i === 0 ? 0 : spans[SPAN * (i - 1)];
    const end = spans[SPAN * i];
    if (!startsWith(bytes, start, end, prefix)) {
      const reason = `key \`${text(bytes.subarray(start, end))}\` is outside \`${text(prefix)}*\``;
      return { tag: "deny", val: { rule: "key-prefix", reason } };
    }
  }
  return { tag: "abstain" };
}

export const guard = {
  admit(who, cmd) {
    return judge(prefixOf(who), cmd.argv.bytes, cmd.argv.spans, 0, cmd.argv.spans.length / SPAN);
  },
  admitBatch(who, batch) {
    const prefix = prefixOf(who);
    let first = 0;
    return batch.commands.map((command) => {
      const verdict = judge(prefix, batch.argv.bytes, batch.argv.spans, first, command.args);
      first += command.args;
      return verdict;
    });
  },
};
