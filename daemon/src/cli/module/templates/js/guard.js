// Built by `tollgate module build` with componentize-qjs (QuickJS), WASI stubbed out.
// A guard module: every key must start with the caller's principal and a separator
// (`:` unless config.get() says otherwise). It abstains, or denies.
import config from "tollgate:policy/config";

const SPAN = 3;
let separator = null;

function prefixOf(who) {
  if (separator === null) {
    const configured = config.get();
    separator = configured.length === 0 ? ":" : new TextDecoder().decode(configured);
  }
  return new TextEncoder().encode(who.principal + separator);
}

function startsWith(bytes, start, end, prefix) {
  if (end - start < prefix.length) return false;
  for (let i = 0; i < prefix.length; i++) if (bytes[start + i] !== prefix[i]) return false;
  return true;
}

// Judges arguments [first, first + count) of argv.
function judge(prefix, bytes, spans, first, count) {
  for (let i = first; i < first + count; i++) {
    const access = spans[SPAN * i + 2];
    if (access === 0) continue;
    const start = i === 0 ? 0 : spans[SPAN * (i - 1)];
    const end = spans[SPAN * i];
    if (!startsWith(bytes, start, end, prefix)) {
      const dec = new TextDecoder();
      return { tag: "deny", val: { rule: "key-prefix",
        reason: `key \`${dec.decode(bytes.subarray(start, end))}\` is outside \`${dec.decode(prefix)}*\`` } };
    }
  }
  return { tag: "abstain" };
}

export const guard = {
  admit(who, cmd) {
    const n = cmd.argv.spans.length / SPAN;
    return judge(prefixOf(who), cmd.argv.bytes, cmd.argv.spans, 0, n);
  },
  admitBatch(who, batch) {
    const prefix = prefixOf(who);
    let first = 0;
    return batch.commands.map((c) => {
      const v = judge(prefix, batch.argv.bytes, batch.argv.spans, first, c.args);
      first += c.args;
      return v;
    });
  },
};
