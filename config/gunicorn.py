"""gunicorn's settings for the web process (`-c config/gunicorn.py`, as the Procfile does).

The workers are gevent's: each request runs as a greenlet, and blocking I/O (PostgreSQL
through psycopg, which detects gevent's patching, Redis, sockets) yields to the others.
A runner's poll is held for up to 30 seconds waiting on Redis (api/runners.py,
docs/runners.md); as a greenlet it holds no thread, and it closes its database
connection before it waits, so hundreds of runners polling neither exhaust the workers
nor PostgreSQL's connections, and the API stays responsive beside them. Sync workers
would each be pinned by one held poll.

Each greenlet has its own database connection for the length of its request, so the
web process borrows them from a pool (DATABASE_POOL_SIZE per worker process, 10 unless
the environment says otherwise): persistent per-greenlet connections would be one per
greenlet that ever ran, and a connection opened per request halved the API's throughput
under `make load`.
"""

from __future__ import annotations

import logging
import os

worker_class = "gevent"
# Requests (held polls included) one worker serves at once.
worker_connections = int(os.environ.get("WEB_WORKER_CONNECTIONS", "1000"))
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
timeout = 30
graceful_timeout = 5
# How long an idle client connection is kept open. gunicorn's default (2 s) is shorter
# than a client's pause between requests can be: the server closes the connection just
# as the client sends its next request on it, which the client sees as a connection
# closed without an answer (make load saw one POST /runs end so). Longer than the idle
# timeout of what usually stands in front (a load balancer's 60 s) so that the server is
# never the side that closes first; an idle connection costs a gevent worker a socket and
# no greenlet's stack worth speaking of.
keepalive = int(os.environ.get("WEB_KEEPALIVE_S", "75"))
# gunicorn's own lines at the processes' level (LOG_LEVEL, as the settings read it), and
# the access log, a line per request, only where INFO is let through: production's
# default keeps it, make run's WARNING does not (a request was a line in its terminal).
loglevel = os.environ.get("LOG_LEVEL", "") or "INFO"
_level = logging.getLevelNamesMapping().get(loglevel.upper(), logging.INFO)
accesslog = "-" if _level <= logging.INFO else None
# The access log writes a callback URL's token (a credential) replaced.
logger_class = "config.access_log.AccessLogger"
raw_env = [f"DATABASE_POOL_SIZE={os.environ.get('DATABASE_POOL_SIZE', '10')}"]
