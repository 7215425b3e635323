"""Unpadded base64url (RFC 4648 section 5, without ``=``): the text form of the gateway's
signed tokens, ``requestId``s and delay ids.

One spelling per token. Python's decoder is lenient: it takes ``=`` padding (also too much of
it), and stray bits in the last character, so ``abc``, ``abc=``, ``abc==`` and ``abd`` can all
decode to the same bytes. A token that several strings name would be accepted under spellings
the gateway never handed out (a cancel of ``<delayId>==`` worked), and any later check keyed by
the string (a Redis mark, a log search, a cache in front) would see different tokens. So
:func:`decode` takes exactly what :func:`encode` makes, and nothing else.
"""

from __future__ import annotations

import base64
import binascii
import re

_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


def encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode(text: str, max_len: int) -> bytes:
    """The bytes of ``text`` if it is canonical unpadded base64url of at most ``max_len``
    characters; :class:`ValueError` (its message says which rule failed) otherwise."""
    if not isinstance(text, str) or not text or len(text) > max_len or not _ALPHABET.fullmatch(text):
        raise ValueError("not unpadded base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):  # e.g. a length of 4n+1
        raise ValueError("not unpadded base64url") from None
    if encode(raw) != text:
        raise ValueError("not canonical base64url")
    return raw
