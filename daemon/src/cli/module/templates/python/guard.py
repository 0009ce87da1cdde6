"""A guard module: every key must start with the caller's principal and a separator
(`:` unless config.get() says otherwise). It abstains, or denies."""
from typing import List

from wit_world import exports
from wit_world.imports import config
from wit_world.imports.types import (
    Batch, Caller, Command, Denial, Verdict, Verdict_Abstain, Verdict_Deny,
)

SPAN = 3
_separator = None


def _prefix(who: Caller) -> bytes:
    global _separator
    if _separator is None:
        _separator = config.get() or b":"
    return who.principal.encode() + _separator


def _judge(prefix: bytes, data: bytes, spans: List[int], first: int, count: int) -> Verdict:
    for i in range(first, first + count):
        if spans[SPAN * i + 2] == 0:
            continue
        start = spans[SPAN * (i - 1)] if i > 0 else 0
        key = data[start:spans[SPAN * i]]
        if not key.startswith(prefix):
            reason = f"key `{key.decode(errors='replace')}` is outside `{prefix.decode(errors='replace')}*`"
            return Verdict_Deny(Denial(rule="key-prefix", reason=reason))
    return Verdict_Abstain()


class Guard(exports.Guard):
    def admit(self, who: Caller, cmd: Command) -> Verdict:
        return _judge(_prefix(who), cmd.argv.bytes, cmd.argv.spans, 0, len(cmd.argv.spans) // SPAN)

    def admit_batch(self, who: Caller, batch: Batch) -> List[Verdict]:
        prefix = _prefix(who)
        verdicts, first = [], 0
        for command in batch.commands:
            verdicts.append(_judge(prefix, batch.argv.bytes, batch.argv.spans, first, command.args))
            first += command.args
        return verdicts
