"""gunicorn's settings for the web process (`-c config/gunicorn.py`, as the Procfile does).

The workers are gevent's: each request runs as a greenlet, and blocking I/O (PostgreSQL
through psycopg, which detects gevent's patching, Redis, sockets) yields to the others.
A runner's poll is held for up to 30 seconds waiting on Redis (api/runners.py,
docs/runners.md); as a greenlet it holds no thread, and it closes its database
connection before it waits, so hundreds of runners polling neither exhaust the workers
nor PostgreSQL's connections, and the API stays responsive beside them. Sync workers
would each be pinned by one held poll.

Each greenlet has its own database connection, so persistent connections would leave
one open per greenlet that ever ran: connections close at the end of each request
(DATABASE_CONN_MAX_AGE=0) unless the environment says otherwise.
"""

from __future__ import annotations

import os

worker_class = "gevent"
# Requests (held polls included) one worker serves at once.
worker_connections = int(os.environ.get("WEB_WORKER_CONNECTIONS", "1000"))
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
timeout = 30
graceful_timeout = 5
raw_env = [f"DATABASE_CONN_MAX_AGE={os.environ.get('DATABASE_CONN_MAX_AGE', '0')}"]
