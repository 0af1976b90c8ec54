"""Keyed digests of JSON values: what a row may keep of a value that can hold a secret.

A bare hash of a stored value lets whoever reads the row confirm a guess of what the
value held (a webhook's signing secret in a request body, an API key in a step's
parameters) by hashing the guess. An HMAC keyed from the server's ``SECRET_KEY`` confirms
nothing without that key, and still tells two values apart.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.crypto import salted_hmac


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON: key order and whitespace do not matter."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def keyed_digest(purpose: str, value: Any, secret: str | bytes | None = None) -> str:
    """HMAC-SHA256 (hex) of ``value`` as canonical JSON, under a key derived from
    ``SECRET_KEY`` (or ``secret``) for ``purpose``: each purpose has a key of its own."""
    return salted_hmac(purpose, canonical_json(value), secret, algorithm="sha256").hexdigest()
