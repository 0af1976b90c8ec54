"""`make run` end to end, as a developer runs it: `make -o install run` (the target without
its `make install`) in a terminal of its own, against the test servers (DATABASE_URL and
CELERY_BROKER_URL set, so it starts no servers of its own).

It must bring web, worker, webhooks, beat and Flower up with /healthz answering 200; print a banner
that tells the truth (URLs that can be pasted, commands with their virtualenv's path, the
demo run's page, what a second terminal must export); and on the terminal's Ctrl-C stop
every process it started and exit 0, make included.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import signal
import subprocess
import termios
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.urls import reverse

from runs.models import Run
from tests.support import (
    ROOT,
    child_env,
    free_port,
    processes_with_env,
    shared_database_url,
    wait_until,
)


class Terminal:
    """A command in a pseudo-terminal of its own, its controlling terminal: the
    terminal's Ctrl-C reaches whatever process group holds its foreground, as in a
    developer's shell. Everything it prints is kept in ``log``."""

    def __init__(self, args: list[str], env: Mapping[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=dict(env),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            # After setsid, with the terminal on fd 0: make it the session's terminal.
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.master = master
        self._reader = threading.Thread(target=self._keep, daemon=True)
        self._reader.start()

    def _keep(self) -> None:
        with self._log:
            while True:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: every process holding the terminal has gone
                    return
                if not chunk:
                    return
                self._log.write(chunk)
                self._log.flush()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace").replace("\r\n", "\n")

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def wait(self, timeout: float) -> int:
        status = self.proc.wait(timeout)
        self._reader.join(10)
        os.close(self.master)
        return status

    def kill_group(self) -> None:
        """SIGKILL every process left in its session's first group (teardown safety net)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def banner_line(output: str, label: str) -> str:
    found = re.search(rf"^    {label} +(\S.*)$", output, re.MULTILINE)
    assert found, f"no {label!r} line in:\n{output}"
    return found[1]


def admin_page(site: str, path: str, password: str) -> httpx.Response:
    """``path`` as the admin user sees it, signed in through the login form."""
    with httpx.Client(base_url=site, timeout=10) as browser:
        form = browser.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert token, form.text
        signed_in = browser.post(
            "/admin/login/",
            data={
                "username": "admin",
                "password": password,
                "csrfmiddlewaretoken": token[1],
                "next": "/admin/",
            },
        )
        assert signed_in.status_code == 302, signed_in.text
        return browser.get(path)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_make_run_starts_every_process_healthy_tells_the_truth_and_ctrl_c_exits_0(
    tmp_path_factory: pytest.TempPathFactory, celery_worker: str
) -> None:
    marker = f"ORCH_TEST_MARKER_{uuid.uuid4().hex}"
    data_dir = tmp_path_factory.mktemp("run-data")
    web_port, flower_port = free_port(), free_port()
    env = child_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        DATA_DIR=str(data_dir),
        STATIC_ROOT=str(data_dir / "static"),
        WEB_PORT=str(web_port),
        FLOWER_PORT=str(flower_port),
        FLOWER_BASIC_AUTH="admin:admin",
        WORKER_CONCURRENCY="1",
        **{marker: "1"},
    )
    venv = env.get("VENV", ".venv")
    site = f"http://127.0.0.1:{web_port}"
    make = Terminal(["make", "-o", "install", "run"], env, data_dir / "run.log")
    try:
        wait_until(
            lambda: "Orchestrator is up." in make.output() or make.proc.poll() is not None,
            timeout=120,
            what="make run to report the stack up",
        )
        output = make.output()
        assert make.proc.poll() is None, output
        health = httpx.get(f"{site}/healthz", timeout=10)
        assert health.status_code == 200, health.text
        flower = httpx.get(f"http://127.0.0.1:{flower_port}/api/workers", timeout=10)
        assert flower.status_code == 401
        for path in ("/", "/api/v1/", "/admin/login/"):
            assert httpx.get(f"{site}{path}", timeout=10).status_code == 200, path
        password = (data_dir / "admin-password").read_text().strip()
        assert f"(admin / {password})" in output
        token = (data_dir / "metrics-token").read_text().strip()
        assert f"METRICS_TOKEN={token}" in output
        scraped = httpx.get(
            f"{site}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert scraped.status_code == 200
        assert 'orchestrator_runs{status="completed"}' in scraped.text
        assert "/admin/dashboard/" in output
        assert "demo run completed" in output
        assert "credits: reserved" in output
        # Readable locally: no JSON log lines, no per-task INFO flood (run.sh's defaults).
        assert '{"ts": ' not in output
        assert "succeeded in" not in output
        # Run as root on purpose (a container): Celery's warning about it is silenced.
        assert "superuser privileges" not in output
        # Probes before the stack is ready are answers, not the server's errors.
        assert "Service Unavailable: /healthz" not in output

        # The servers' URLs as they can be pasted (these have no password to hide).
        assert banner_line(output, "PostgreSQL") == shared_database_url()
        assert banner_line(output, "Redis broker") == settings.CELERY_BROKER_URL
        # The web's address as the README's commands take it, and, not the default
        # servers, what manage.py there needs: a second terminal exports these first.
        assert f"    export URL={site}\n" in output
        assert f"    export DATABASE_URL={shared_database_url()}\n" in output
        assert f"    export CELERY_BROKER_URL={settings.CELERY_BROKER_URL}\n" in output
        assert "    export DJANGO_SETTINGS_MODULE=config.settings.local\n" in output
        # Commands as they run from a new terminal: with the virtualenv's path.
        assert f"    {venv}/bin/python manage.py create_org NAME " in output
        assert f"    {venv}/bin/orch login --url $URL --api-key KEY " in output
        assert f"    source {venv}/bin/activate " in output  # orch on PATH, as its hints say
        # The demo run's page: the admin's page of that run.
        demo_link = banner_line(output, "Demo run")
        found = re.fullmatch(rf"{re.escape(site)}(/admin/runs/run/([0-9a-f-]+)/change/)", demo_link)
        assert found, demo_link
        run = Run.objects.get(pk=found[2])
        assert run.status == "completed"
        assert found[1] == reverse("admin:runs_run_change", args=[run.pk])
        page = admin_page(site, found[1], password)
        assert page.status_code == 200
        assert str(run.pk) in page.text

        names = {
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for pid in processes_with_env(marker)
        }
        for needle in ("gunicorn", "worker", "beat", "flower"):
            assert any(needle in name for name in names), (needle, names)
        # The webhooks' own sender, apart from the workers that run steps.
        assert any("--queues webhooks --pool threads" in name for name in names), names
        assert not any("steps" in name and "webhooks" in name for name in names), names

        # Ctrl-C in the terminal: the stack stops, and so does make, with status 0.
        make.ctrl_c()
        status = make.wait(90)
        output = make.output()
        assert status == 0, output[-3000:]
        assert "make: ***" not in output  # make's own "Error 130" / "Interrupt"
        wait_until(
            lambda: not processes_with_env(marker),
            timeout=30,
            what="every process started by make run to exit",
        )
    finally:
        make.kill_group()
        for pid in processes_with_env(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgres://orchestrator@127.0.0.1:55532/orchestrator",
            "postgres://orchestrator@127.0.0.1:55532/orchestrator",
        ),
        ("postgres://app:s3cret%40x@db:5432/orch", "postgres://app:***@db:5432/orch"),
        ("redis://:secret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("redis://127.0.0.1:56379/0", "redis://127.0.0.1:56379/0"),
        (
            "sentinel://:pw@h1:26379;sentinel://:pw@h2:26379",
            "sentinel://:***@h1:26379;sentinel://:***@h2:26379",
        ),
    ],
)
def test_the_banner_hides_a_password_and_nothing_else(url: str, shown: str) -> None:
    masked = subprocess.run(
        ["bash", "-c", 'source scripts/run.sh && mask_password "$1"', "bash", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )

    assert masked.stdout.strip() == shown
