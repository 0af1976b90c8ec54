"""The web tier ``many_runs_api`` submits to: gunicorn as `make load`'s stack starts it.

``reliability.stack.Stack`` starts it (config/gunicorn.py: gevent workers, a pool of
database connections per worker process; as many worker processes as `make load`
runs), alone, on the bench's own PostgreSQL and Redis (DATABASE_URL and
CELERY_BROKER_URL), on the first scenario that needs it; ``stop()`` stops it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from reliability.load import Config
from reliability.stack import Stack, free_port

# The per-key throttle stays on (its Redis round trip is part of every request's cost),
# at a rate that 500 starts of one organization's key in a few seconds stay under.
SETTINGS = {"API_THROTTLE_RATE": "100000/min"}


class Web:
    """``directory``: where its log goes (web.log). ``env``: on top of the stack's
    environment (a test's database and settings module)."""

    def __init__(
        self,
        directory: Path,
        workers: int = Config.web_workers,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.stack = Stack(
            directory,
            web_workers=workers,
            database_url=os.environ.get("DATABASE_URL", ""),
            broker_url=os.environ.get("CELERY_BROKER_URL", ""),
            settings_env={**SETTINGS, **(env or {})},
        )

    @property
    def workers(self) -> int:
        return self.stack.web_workers

    def url(self) -> str:
        """Its base URL, started (and answering) first if it is not."""
        if "web" not in self.stack.processes:
            self.stack.directory.mkdir(parents=True, exist_ok=True)
            self.stack.web_port = free_port()
            self.stack.start_web()
            try:
                self.stack.wait_healthy()
            except BaseException:
                self.stop()
                del self.stack.processes["web"]  # the next scenario starts it anew
                raise
        return self.stack.base_url

    def pid(self) -> int | None:
        """gunicorn's master process, while it runs."""
        process = self.stack.processes.get("web")
        return process.pid if process is not None else None

    def stop(self) -> None:
        self.stack.stop_processes()
