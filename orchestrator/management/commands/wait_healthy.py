"""Poll a /healthz URL until it answers 200, or fail after a timeout."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Wait until the given health URL answers 200."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", required=True)
        parser.add_argument("--timeout", type=float, default=60.0)

    def handle(self, *args: Any, **options: Any) -> None:
        deadline = time.monotonic() + options["timeout"]
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                response = httpx.get(options["url"], timeout=5.0)
                if response.status_code == 200:
                    self.stdout.write(f"healthy: {response.text}")
                    return
                last = f"{response.status_code}: {response.text}"
            except httpx.HTTPError as exc:
                last = str(exc)
            time.sleep(0.5)  # polling an external process; nothing to wait on instead
        with contextlib.suppress(IndexError, ValueError):
            last = json.dumps(json.loads(last.split(": ", 1)[1]), indent=2)
        raise CommandError(f"{options['url']} not healthy after {options['timeout']}s: {last}")
