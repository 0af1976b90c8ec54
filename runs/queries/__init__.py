"""The runs app's named statements: each ``<name>.sql`` of this folder by ``name``, read
once (``common.queries.named``), for the modules that run them (``common.queries.fetch``
or a cursor)."""

from __future__ import annotations

from pathlib import Path

from common.queries import named

QUERIES = named(Path(__file__).parent)
