"""Database connection hygiene between units of work (a worker's tasks, a step's tool)."""

from __future__ import annotations

import logging

from django.db import connection
from psycopg.pq import TransactionStatus

logger = logging.getLogger(__name__)


def discard_interrupted_connection() -> None:
    """Close the database connection if a query on it was interrupted mid-command.

    A soft time limit or a revoke is a signal that raises wherever the task is, a query
    included. psycopg cancels an interrupted query only for KeyboardInterrupt and
    SystemExit; after any other exception the connection stays ACTIVE and the next
    statement fails ("can't change 'autocommit' now"), which lost the recording of a
    timed-out step (found by make load). The query is cancelled on the server (closing
    alone leaves it running there until it ends) and the connection closed; Django opens
    a fresh one for what comes next.
    """
    raw = connection.connection
    # ACTIVE only: INTRANS is an open transaction (a test's), not an interrupted command.
    if raw is None or raw.info.transaction_status != TransactionStatus.ACTIVE:
        return
    try:
        raw.cancel_safe(timeout=5)
    except Exception:  # the server may be gone too; closing is what matters
        logger.warning("could not cancel an interrupted query", exc_info=True)
    connection.close()
