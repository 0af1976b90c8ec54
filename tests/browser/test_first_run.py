"""The README's first run, followed as a newcomer follows it: the commands of its marked
section ("First run"), read from README.md by this test so that the two cannot drift
apart, each run as written by bash in the checkout against a stack started as `make run`
starts it; then the run's page, at the README's address, in a real browser.

What the test changes, and nothing else:

- the addresses. `make run` gets free ports for the web (`WEB_PORT`) and Flower, and the
  test servers (`DATABASE_URL`, `CELERY_BROKER_URL`, so it starts none of its own): no
  address is a default. The second terminal runs the `export` lines the banner printed
  where the README has its `export URL=...` (the web's address, and the servers'), as the
  README says to; no other command names an address;
- the placeholders a person fills in from what came before: `ork_...` is the key
  `create_org` printed, `RUN_ID` the id the POST answered;
- `make run` is `make install`, then `scripts/run.sh`: the test runs the second
  (`make test` installs first), without the demo run (tests/integration/test_make_run.py
  follows that).

The second terminal has no virtualenv on its PATH, no `DJANGO_SETTINGS_MODULE` and a
HOME of its own, as a new terminal would.

Then the links the server writes itself name the same address (`PUBLIC_BASE_URL`, derived
from `WEB_PORT`): a webhook's body links its run at the web `make run` started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from runs.models import Run
from tests.http_fixture import HttpServer
from tests.support import ROOT, Child, child_env, free_port, processes_with_env, wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
]

BEGIN, END = "<!-- first-run:", "<!-- /first-run -->"
DEFAULT_ADDRESS = "127.0.0.1:8000"
# The README's line that stands for the banner's exports, with make run's defaults.
URL_EXPORT = f"export URL=http://{DEFAULT_ADDRESS}"
# What the stack may log after its banner, at make run's level (WARNING), through the
# whole first run: its requests, runs, webhook and pages. A request was a line (the
# access log), a 4xx two, each start's not-ready /healthz probes an ERROR each.
MAX_LINES_AFTER_BANNER = 0


def first_run_section() -> str:
    text = (ROOT / "README.md").read_text()
    assert BEGIN in text, "README.md lost its first-run markers"
    assert END in text, "README.md lost its first-run markers"
    return text[text.index(BEGIN) : text.index(END)]


def commands(section: str) -> list[list[str]]:
    """Each ```sh block's command lines: continued lines joined, comment lines left out
    (a comment after a command stays; bash reads it as one)."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.M | re.S)
    return [
        [
            line.strip()
            for line in block.replace("\\\n", " ").splitlines()
            if line.strip()[:1] not in ("", "#")
        ]
        for block in blocks
    ]


def after_banner(output: str) -> list[str]:
    """The lines the stack printed after its banner (which ends with a rule)."""
    rule = "=" * 80
    assert rule in output, output
    tail = output[output.rindex(rule) + len(rule) :]
    return [line for line in tail.splitlines() if line.strip()]


def banner_exports(output: str) -> list[str]:
    """The ``export NAME=value`` lines `make run` printed for a second terminal."""
    banner = output[output.index("In another terminal") :]
    return re.findall(r"^    (export [A-Z_]+=\S+)$", banner, re.M)


class Terminal:
    """The second terminal: each command run by bash in the checkout, with the variables
    that earlier assignments (``KEY=...``, ``export URL=...``) set, and the placeholders
    filled in."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.filled: dict[str, str] = {}

    def fill(self, command: str) -> str:
        for placeholder, value in self.filled.items():
            command = command.replace(placeholder, value)
        code = command.split(" # ")[0]  # what bash runs; a comment may name a placeholder
        for placeholder in ("ork_...", "RUN_ID"):
            assert placeholder not in code, f"nothing printed before fills {placeholder}"
        return command

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        line = self.fill(command)
        assignment = re.match(r"(?:export )?([A-Za-z_][A-Za-z0-9_]*)=", line)
        script = f'{line}\nprintf %s "${assignment[1]}"' if assignment else line
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        if assignment:
            self.env[assignment[1]] = result.stdout
        return result


def second_terminal(home: Path) -> dict[str, str]:
    venv_bin = os.path.realpath(Path(sys.executable).parent)
    path = [p for p in os.environ["PATH"].split(os.pathsep) if os.path.realpath(p) != venv_bin]
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("ORCH_", "DJANGO_", "PYTEST_", "ORCHESTRATOR_"))
        and name not in ("VIRTUAL_ENV", "DATABASE_URL", "CELERY_BROKER_URL")
    }
    env.update(
        PATH=os.pathsep.join(path),
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
    )
    return env


def test_the_readmes_first_run_works_as_written(
    tmp_path_factory: pytest.TempPathFactory, browser: Any, screenshots: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    section = first_run_section()
    blocks = commands(section)
    assert blocks[0] == ["make run"], blocks
    second = [command for block in blocks[1:] for command in block]
    # The address is written once, in the line the banner's exports stand for.
    assert second[0].split(" # ")[0].strip() == URL_EXPORT, second
    assert not [command for command in second[1:] if DEFAULT_ADDRESS in command], second

    marker = f"ORCH_TEST_MARKER_{uuid.uuid4().hex}"
    data_dir = tmp_path_factory.mktemp("first-run")
    web_port = free_port()
    address = f"127.0.0.1:{web_port}"
    stack_env = child_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        DATA_DIR=str(data_dir),
        STATIC_ROOT=str(data_dir / "static"),
        WEB_PORT=str(web_port),
        FLOWER_PORT=str(free_port()),
        FLOWER_BASIC_AUTH="admin:admin",
        WORKER_CONCURRENCY="1",
        SKIP_DEMO="1",
        # The webhook's receiver is this test's, on the loopback.
        HTTP_TOOL_ALLOWED_NETWORKS="127.0.0.1/32",
        **{marker: "1"},
    )
    stack_env.pop("PUBLIC_BASE_URL", None)  # derived from WEB_PORT, as on a fresh machine
    stack = Child(["bash", str(ROOT / "scripts" / "run.sh")], stack_env, data_dir / "run.log")
    terminal = Terminal(second_terminal(tmp_path_factory.mktemp("home")))
    try:
        wait_until(
            lambda: "Orchestrator is up." in stack.output() or not stack.alive(),
            timeout=120,
            what="make run to report the stack up",
        )
        assert stack.alive(), stack.output()

        exports = banner_exports(stack.output())
        assert f"export URL=http://{address}" in exports, stack.output()
        watched = polled = None
        for command in second:
            if command.startswith(URL_EXPORT):
                for export in exports:
                    terminal.run(export)
            elif "create_org" in command:
                printed = json.loads(terminal.run(command).stdout)
                terminal.filled["ork_..."] = printed["api_key"]
            elif "runs submit" in command:
                watched = terminal.run(command).stdout
            elif "RUN_ID" in command:
                # Typed a moment later, the run has ended: the test asks until it has.
                def ended(command: str = command) -> dict[str, Any] | None:
                    answer: dict[str, Any] = json.loads(terminal.run(command).stdout)
                    return answer if answer["status"] == "completed" else None

                polled = wait_until(ended, timeout=60, what="the curl run to complete")
            elif command.startswith("curl"):
                created = json.loads(terminal.run(command).stdout)
                assert created["status"] in ("running", "pending"), created
                terminal.filled["RUN_ID"] = created["id"]
            else:
                terminal.run(command)

        assert watched is not None, second
        assert polled is not None, second
        found = re.search(r"^run (\S+) completed:", watched, re.M)
        assert found, watched
        run_id = found[1]
        assert Run.objects.get(pk=run_id).status == "completed"
        assert Run.objects.get(pk=polled["id"]).name == "hello"
        assert_webhooks_link_the_run_here(terminal.env["URL"], terminal.filled["ork_..."])

        # The run's page, from the README's address, as the admin `make run` printed.
        page = re.search(r"<(http://127\.0\.0\.1:8000/admin/[^>]*)>", section)
        assert page, "the first run no longer links the runs' admin page"
        password = (data_dir / "admin-password").read_text().strip()
        assert password in stack.output()
        # The browser resolves nothing but `localhost` (tests/browser/conftest.py), an IP
        # address included: the same server by its name.
        browser.get(page[1].replace(DEFAULT_ADDRESS, f"localhost:{web_port}"))
        browser.find_element(By.NAME, "username").send_keys("admin")
        browser.find_element(By.NAME, "password").send_keys(password)
        browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        link = wait.until(
            lambda driver: driver.find_elements(By.CSS_SELECTOR, f"a[href*='{run_id}']")
        )
        link[0].click()
        wait.until(lambda driver: driver.find_elements(By.CSS_SELECTOR, "#run-status.st-completed"))
        browser.save_screenshot(str(screenshots / "first-run.png"))

        logged = after_banner(stack.output())
        assert len(logged) <= MAX_LINES_AFTER_BANNER, "\n".join(logged)

        # Ctrl-C in the first terminal stops everything it started.
        os.killpg(stack.pid, signal.SIGINT)
        stack.proc.wait(60)
        wait_until(
            lambda: not processes_with_env(marker),
            timeout=30,
            what="every process make run started to exit",
        )
    finally:
        stack.kill_group()
        for pid in processes_with_env(marker):
            os.kill(pid, signal.SIGKILL)


def assert_webhooks_link_the_run_here(url: str, key: str) -> None:
    """A run's webhook, sent by the stack's `webhooks` process, links the run at ``url``:
    the web `make run` started, whatever its port."""
    headers = {"Authorization": f"Bearer {key}"}
    plan = (ROOT / "examples" / "hello.yaml").read_text()
    with HttpServer() as receiver:
        receiver.respond("/hook", status=204)
        hook = httpx.post(
            f"{url}/api/v1/webhooks",
            json={"url": f"{receiver.url}/hook", "events": ["run.completed"]},
            headers=headers,
            timeout=10,
        )
        assert hook.status_code == 201, hook.text
        created = httpx.post(
            f"{url}/api/v1/runs",
            content="start: true\nplan:\n" + "".join(f"  {line}\n" for line in plan.splitlines()),
            headers={**headers, "Content-Type": "application/yaml"},
            timeout=10,
        )
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]

        def delivered() -> dict[str, Any] | None:
            bodies = [request.json() for request in receiver.requests]
            return next((body for body in bodies if body["run"]["id"] == run_id), None)

        body = wait_until(delivered, timeout=60, what="the run's webhook")
    assert body["links"]["run"] == f"{url}/api/v1/runs/{run_id}"
    linked = httpx.get(body["links"]["run"], headers=headers, timeout=10)
    assert linked.status_code == 200, linked.text
    assert linked.json()["id"] == run_id
