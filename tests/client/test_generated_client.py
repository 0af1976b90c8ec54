"""A client generated from the served OpenAPI document by openapi-python-client: the
generator understands the document, and the client it makes drives a dag run against the
live server and the session's real worker (created, started, followed to its end, its
steps and events read). An answer the generated models cannot read fails here: a required
field missing, an enum value the document does not list, a null where it says never.

openapi-python-client pins typer<0.28 and the project's `orch` needs 0.29, so it lives in
a virtualenv of its own, built from the pins of tests/client/openapi-python-client.txt
once for each version of that file (and of Python) and kept in pytest's cache directory
(.pytest_cache, git-ignored, removed by `make clean`). The generated package is written
under a temporary directory and run there, in a subprocess with that virtualenv's python
(tests/client/drive_generated_client.py): it never enters the project or its virtualenv.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from runs.models import Run
from runs.selectors import run_history
from tests.tenants import LiveTenant

REQUIREMENTS = Path(__file__).with_name("openapi-python-client.txt")
DRIVER = Path(__file__).with_name("drive_generated_client.py")
# What the generator may say. Each problem it meets is a block: a header, a blank line,
# the detail, a blank line, the part of the document as indented JSON. The one problem
# allowed: a body that is not JSON, skipped (it speaks JSON, forms and files), such as the
# YAML plan POST /runs takes beside its JSON one.
EXPECTED_OUTPUT = re.compile(
    r"Generating .+"
    r"|Warning\(s\) encountered while generating\..*"
    r"|If you believe this was a mistake.*"
    r"|WARNING parsing [A-Z]+ \S+ within \S+\."
    r"|Unsupported content type (?!application/(\S+\+)?json\b)\S+"
)
# The generator's config: no formatting of the code it writes (its ruff hooks): nobody
# reads it, and the test would wait for them.
GENERATOR_CONFIG = "post_hooks: []\n"


def pip(python: Path, *args: str) -> None:
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"pip {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="session")
def generator_python(pytestconfig: pytest.Config) -> Path:
    """The python of openapi-python-client's virtualenv, built when its pins changed."""
    if pytestconfig.cache is None:
        pytest.fail("needs pytest's cache provider (do not run with -p no:cacheprovider)")
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + sys.version.encode()).hexdigest()[:16]
    root = pytestconfig.cache.mkdir("openapi-python-client")
    home = root / key
    python = home / "bin" / "python"
    installed = home / ".installed"
    # Two `make test` at once must not build into each other's half-made virtualenv.
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed.exists():
            for stale in root.iterdir():  # other pins' (or a build that was cut short)
                if stale.is_dir():
                    shutil.rmtree(stale)
            venv.create(home, with_pip=True)
            pip(python, "install", "--quiet", "--no-deps", "--requirement", str(REQUIREMENTS))
            pip(python, "check")  # every requirement of every pin is pinned too
            installed.write_text(REQUIREMENTS.read_text())
    return python


@dataclass(frozen=True)
class Generated:
    parent: Path  # the directory holding the package `orchestrator_api`
    said: list[str]  # the generator's output, less blank lines and the document's JSON


@pytest.fixture(scope="module")
def generated(generator_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """A client generated from the document `/api/schema/` serves, as JSON."""
    here = tmp_path_factory.mktemp("generated-client")
    response = Client().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    (here / "openapi.json").write_bytes(response.content)
    (here / "config.yaml").write_text(GENERATOR_CONFIG)
    result = subprocess.run(
        [
            str(generator_python), "-m", "openapi_python_client", "generate",
            "--path", str(here / "openapi.json"),
            "--config", str(here / "config.yaml"),
            "--meta", "none",
            "--output-path", str(here / "orchestrator_api"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert (here / "orchestrator_api" / "client.py").exists(), result.stdout
    said = [
        line
        for line in f"{result.stdout}\n{result.stderr}".splitlines()
        if line.strip() and not line.startswith((" ", "{", "}"))
    ]
    return Generated(parent=here, said=said)


def test_the_generator_understands_every_json_operation_and_schema(generated: Generated) -> None:
    assert not [line for line in generated.said if not EXPECTED_OUTPUT.fullmatch(line)]
    # POST /runs' YAML body is skipped with a warning: seeing it proves the output was
    # read as the generator writes it, so that nothing else means nothing else.
    assert "WARNING parsing POST /api/v1/runs within runs." in generated.said
    assert "Unsupported content type application/yaml" in generated.said


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_the_generated_client_creates_starts_follows_and_reads_a_dag_run(
    generated: Generated, generator_python: Path, tenant: LiveTenant, celery_worker: str
) -> None:
    # Its own environment: nothing of this project's virtualenv or settings.
    env = {name: value for name, value in os.environ.items() if name in ("PATH", "HOME", "TMPDIR")}
    result = subprocess.run(
        [str(generator_python), str(DRIVER), str(generated.parent), tenant.url, tenant.key],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen: dict[str, Any] = json.loads(result.stdout)

    assert seen["statuses"][0] == "created"
    assert seen["statuses"][-1] == "completed", seen["statuses"]
    assert seen["progress"] == {"steps_total": 4, "steps_finished": 4, "percent": 100.0}
    assert seen["outputs"] == {
        "research.fetch.s": {"topic": "chips"},
        "research.left.s": {"side": "left", "topic": "chips"},
        "research.right.s": {"side": "right", "topic": "chips"},
        "research.join.s": {"left": "left", "right": "right"},
    }

    steps = {step["path"].split(".")[1]: step for step in seen["steps"]}
    assert seen["step_count"] == 4
    assert {step["status"] for step in steps.values()} == {"completed"}
    # The dag's order, in the dates the generated models parsed.
    at = {
        (task, moment): datetime.fromisoformat(step[moment])
        for task, step in steps.items()
        for moment in ("started_at", "completed_at")
    }
    for task, needs in {"left": ["fetch"], "right": ["fetch"], "join": ["left", "right"]}.items():
        for need in needs:
            assert at[need, "completed_at"] <= at[task, "started_at"], (need, task)

    # Every event, once, in order, across the cursor's pages.
    events = seen["events"]
    run = Run.objects.get(pk=seen["id"])
    assert run.status == "completed"
    assert [event["id"] for event in events] == list(
        run_history(run).order_by("id").values_list("id", flat=True)
    )
    assert seen["event_pages"] > 2
    run_states = [e["to_status"] for e in events if e["entity"] == "run" and e["to_status"]]
    assert run_states == ["pending", "running", "completed"]
    assert {e["path"] for e in events if e["entity"] == "task"} == {
        "research.fetch",
        "research.left",
        "research.right",
        "research.join",
    }
