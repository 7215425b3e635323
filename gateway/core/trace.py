"""W3C Trace Context (https://www.w3.org/TR/trace-context/) carried by records.

A produce request's ``traceparent`` (and ``tracestate``) HTTP headers go into each record's
headers of the same names, unless the record carries its own. Record headers travel as they are
through the delay wheel, retries and dead letters (core/delay.py, core/relay.py, core/nack.py
keep every header that is not the gateway's own), so a fetch gives them back with the record;
a client that asks (``Prefer: trace-context``) also gets the batch's first context as its
answer's own ``traceparent``/``tracestate`` headers.

Invalid values are dropped, as the specification asks of a receiver (section 3.2.2.x: "the
vendor MUST ignore"): a malformed ``traceparent`` never reaches a record, and a ``tracestate``
travels only beside a valid ``traceparent``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from ..broker import OutgoingMessage, Record

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: version 00 (a later version's first four fields are read the same way, section 3.2.4)
_PARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
#: section 3.3.1.1: at most 32 list members; 512 characters is what a vendor must propagate
MAX_TRACESTATE = 512
#: The ``Prefer`` token that asks for a batch's trace context as the answer's headers.
PREFER = "trace-context"


def valid_parent(v: str | None) -> bool:
    if not v:
        return False
    m = _PARENT.fullmatch(v)
    if m is None:
        return False
    version, trace_id, parent_id, _, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        return False
    return trace_id != "0" * 32 and parent_id != "0" * 16


def context_headers(traceparent: str | None,
                    tracestate: str | None) -> list[tuple[str, bytes]]:
    """The record headers a request's trace context makes: none if it has no valid one."""
    if not valid_parent(traceparent):
        return []
    assert traceparent is not None
    out = [(TRACEPARENT, traceparent.encode())]
    if tracestate and len(tracestate) <= MAX_TRACESTATE and tracestate.isascii():
        out.append((TRACESTATE, tracestate.encode()))
    return out


def stamp(messages: list[OutgoingMessage],
          context: list[tuple[str, bytes]]) -> list[OutgoingMessage]:
    """The messages with the request's trace context, except those that carry their own
    ``traceparent`` (a record's own context wins)."""
    if not context:
        return messages
    return [m if any(n == TRACEPARENT for n, _ in m.headers)
            else replace(m, headers=[*m.headers, *context]) for m in messages]


def first_context(records: Sequence[Record]) -> dict[str, str]:
    """The first trace context among the records, as HTTP headers (empty: none has one)."""
    for r in records:
        parent = next((v for n, v in r.headers if n == TRACEPARENT and v), None)
        if parent is not None:
            text = parent.decode(errors="replace")
            if not valid_parent(text):
                continue
            out = {TRACEPARENT: text}
            state = next((v for n, v in r.headers if n == TRACESTATE and v), None)
            if state is not None:
                out[TRACESTATE] = state.decode(errors="replace")
            return out
    return {}


def prefers_context(prefer: str | None) -> bool:
    """Whether a ``Prefer`` header (RFC 7240) asks for ``trace-context``."""
    return bool(prefer) and any(p.split(";", 1)[0].strip().lower() == PREFER
                                for p in (prefer or "").split(","))
