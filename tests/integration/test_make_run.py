"""`scripts/run.sh` (what `make run` runs after installing) end to end.

It is started against the test servers (DATABASE_URL and CELERY_BROKER_URL set, so it
starts no servers of its own), must bring web, worker, beat and Flower up with /healthz
answering 200, and on Ctrl-C must leave no process behind.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, Child, child_env, free_port, processes_with_env, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_run_script_starts_every_process_healthy_and_ctrl_c_leaves_no_orphans(
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
    script = Child(["bash", str(ROOT / "scripts" / "run.sh")], env, data_dir / "run.log")
    try:
        wait_until(
            lambda: "Orchestrator is up." in script.output() or not script.alive(),
            timeout=90,
            what="run.sh to report the stack up",
        )
        assert script.alive(), script.output()
        health = httpx.get(f"http://127.0.0.1:{web_port}/healthz", timeout=10)
        assert health.status_code == 200, health.text
        flower = httpx.get(f"http://127.0.0.1:{flower_port}/api/workers", timeout=10)
        assert flower.status_code == 401
        admin = httpx.get(f"http://127.0.0.1:{web_port}/admin/login/", timeout=10)
        assert admin.status_code == 200
        password = (data_dir / "admin-password").read_text().strip()
        assert f"(admin / {password})" in script.output()
        token = (data_dir / "metrics-token").read_text().strip()
        assert f"METRICS_TOKEN={token}" in script.output()
        scraped = httpx.get(
            f"http://127.0.0.1:{web_port}/metrics",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert scraped.status_code == 200
        assert 'orchestrator_runs{status="completed"}' in scraped.text
        assert "/admin/dashboard/" in script.output()
        assert f"/bin/orch login --url http://127.0.0.1:{web_port}" in script.output()
        assert "demo run completed" in script.output()
        assert "credits: reserved" in script.output()
        # Readable locally: no JSON log lines, no per-task INFO flood (run.sh's defaults).
        assert '{"ts": ' not in script.output()
        assert "succeeded in" not in script.output()

        names = {
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for pid in processes_with_env(marker)
        }
        for needle in ("gunicorn", "worker", "beat", "flower"):
            assert any(needle in name for name in names), (needle, names)

        # Ctrl-C in a terminal signals the whole foreground process group.
        os.killpg(script.pid, signal.SIGINT)
        script.proc.wait(60)
        wait_until(
            lambda: not processes_with_env(marker),
            timeout=30,
            what="every process started by run.sh to exit",
        )
    finally:
        script.kill_group()
        for pid in processes_with_env(marker):
            os.kill(pid, signal.SIGKILL)
