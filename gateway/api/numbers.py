"""Integers from the wire, one rule for every field: what a JSON Schema ``integer`` allows.

JSON bodies: a JSON integer, or a number with no fractional part (``100.0``: JSON Schema counts it
as an integer, and so do the schema-driven clients that send it). Not ``true``/``false``
(Python's ``bool`` is an ``int``), not ``100.5``, not a string.

Query strings: ASCII digits with an optional leading ``-`` (so that ``-1`` is told it is out of
range rather than not a number), nothing else, not even an empty value. Python's ``int()`` also
takes ``+5``, `` 5``, ``1_0`` and digits of any script (``٣``, ``１``), which the spec does not
allow and which a cache or proxy in front would treat as different values.

Which of the two applies depends on where a value came from, never on its Python type: a JSON
string ``"5"`` in a body is a string, not an integer.
"""

from __future__ import annotations

import re
from typing import Any

_QUERY_INT = re.compile(r"-?[0-9]{1,19}")


def json_int(v: Any) -> int | None:
    """``v`` as an int if it is a JSON integer (or a whole float), else None."""
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    return None


def query_int(text: str) -> int | None:
    """A query-string integer (``-?[0-9]+``, ASCII only), else None."""
    return int(text) if _QUERY_INT.fullmatch(text) else None
