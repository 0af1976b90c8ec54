"""The installed ``orch`` command, run as a subprocess against a live server and a real
Celery worker: runs submitted from JSON and YAML files and watched to their end, exit
codes, ``--json`` on every command, approvals, following events, money, errors."""

from __future__ import annotations

import json
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator_client import Client
from runs.models import Run
from tests import factories
from tests.api import states
from tests.client.conftest import Orch
from tests.support import free_port, wait_until
from tests.tenants import LiveTenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ECHO_YAML = """\
name: echoes
agents:
  - name: writer
    tasks:
      - name: draft
        steps:
          - {name: one, tool: echo, params: {text: hello}}
          - {name: two, tool: echo, params: {text: again}}
  - name: checker
    tasks:
      - name: check
        steps:
          - {name: look, tool: echo, params: {ok: true}}
"""

FAILING_YAML = """\
name: doomed
agents:
  - name: worker
    tasks:
      - name: job
        steps:
          - {name: fine, tool: echo}
          - {name: boom, tool: fail, params: {code: invalid_input, message: bad input on purpose}}
"""


def write(path: Path, content: str | dict[str, Any]) -> str:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def reaches(client: Client, run_id: str, status: str) -> None:
    wait_until(
        lambda: client.get_run(run_id)["status"] == status,
        timeout=30,
        what=f"run {run_id} to be {status}",
    )


def read_until(process: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    """Lines of a running ``orch`` until one matches (it prints as it goes)."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"orch ended without printing {pattern!r}:\n{''.join(seen)}")


# --------------------------------------------------------------------------- no worker needed
def test_login_keeps_the_key_in_a_file_only_its_owner_can_read(
    bare_orch: Orch, tenant: LiveTenant, tmp_path: Path
) -> None:
    refused = bare_orch.run("login", "--url", tenant.url, "--api-key", "ork_wrong_key")
    logged_in = bare_orch.run("login", "--url", tenant.url + "/api/v1/", "--api-key", tenant.key)
    balance = bare_orch.json("balance")  # from the file: no ORCH_URL, no ORCH_API_KEY

    path = tmp_path / ".config" / "orch" / "config.json"
    assert refused.returncode == 1
    assert "authentication_failed" in refused.stderr
    assert logged_in.returncode == 0, logged_in.stderr
    assert tenant.organization.name in logged_in.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": tenant.url, "api_key": tenant.key}
    assert balance["available"] == "1000.000000"


def test_usage_errors_exit_2(bare_orch: Orch, orch: Orch, tmp_path: Path) -> None:
    unknown = orch.run("runz", "ls")
    unknown_option = orch.run("runs", "ls", "--colour")
    missing_file = orch.run("runs", "submit", str(tmp_path / "nowhere.yaml"))
    missing_argument = orch.run("runs", "show")
    not_configured = bare_orch.run("balance")
    empty = orch.run("runs", "submit", write(tmp_path / "empty.json", " \n"), "--json")

    for result in (unknown, unknown_option, missing_file, missing_argument, not_configured, empty):
        assert result.returncode == 2, (result.args, result.stdout, result.stderr)
    assert "No such command" in unknown.stderr
    assert "does not exist" in missing_file.stderr
    assert "orch login" in not_configured.stderr
    assert json.loads(empty.stdout)["error"]["code"] == "plan_file"


def test_api_errors_print_their_code_and_message_and_exit_1(
    orch: Orch, client: Client, tmp_path: Path
) -> None:
    invalid = write(tmp_path / "bad.yaml", ECHO_YAML.replace("tool: echo", "tool: ech", 1))
    run = client.cancel_run(client.create_run(factories.plan())["id"])

    missing = orch.run("runs", "show", "00000000-0000-0000-0000-000000000000")
    missing_json = orch.json("runs", "show", "00000000-0000-0000-0000-000000000000", code=1)
    refused = orch.run("runs", "submit", invalid)
    wrong_state = orch.run("runs", "pause", run["id"])

    assert missing.returncode == 1
    assert missing.stderr.startswith("error: not_found: not found (HTTP 404)")
    assert missing_json["error"] == {
        "status": 404,
        "code": "not_found",
        "message": "not found",
        "details": None,
    }
    assert refused.returncode == 1
    assert "error: invalid_plan: the plan is invalid" in refused.stderr
    assert "agents[0].tasks[0].steps[0].tool: unknown tool 'ech'" in refused.stderr
    assert wrong_state.returncode == 1
    assert "invalid_transition: run cannot go from cancelled to paused" in wrong_state.stderr
    assert [listed["id"] for listed in client.runs()] == [run["id"]]  # the bad plan: no run


def test_a_server_that_cannot_be_reached_exits_1(orch: Orch) -> None:
    orch.env.update(ORCH_URL=f"http://127.0.0.1:{free_port()}", ORCH_RETRIES="0")

    result = orch.run("balance")

    assert result.returncode == 1
    assert result.stderr.startswith("error: connection_failed: GET http://127.0.0.1:")


# --------------------------------------------------------------------------- with a worker
@pytest.mark.usefixtures("celery_worker")
def test_a_json_plan_submitted_with_watch_completes_and_exits_0(orch: Orch, tmp_path: Path) -> None:
    plan = write(tmp_path / "plan.json", factories.plan(name="fan", agents=2, steps=2, tool="echo"))

    result = orch.run("runs", "submit", plan, "--watch", "--interval", "0.2")

    assert result.returncode == 0, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"run [0-9a-f-]{36} \(fan\) created: pending", lines[0])
    assert any("agent-0 2/2 completed" in line and "agent-1 2/2" in line for line in lines)
    assert re.fullmatch(
        r"run \S+ completed: 4/4 steps \(100.0%\), [0-9.]+ credits charged", lines[-1]
    )


@pytest.mark.usefixtures("celery_worker")
def test_a_yaml_plan_is_submitted_then_watched_with_json(
    orch: Orch, client: Client, tmp_path: Path
) -> None:
    plan = write(tmp_path / "plan.yaml", ECHO_YAML)

    submitted = orch.json("runs", "submit", plan)
    done = orch.json("runs", "watch", submitted["id"], "--interval", "0.2")
    shown = orch.json("runs", "show", submitted["id"])

    assert submitted["status"] in ("pending", "running")
    assert submitted["plan"]["agents"][1]["name"] == "checker"
    assert (done["id"], done["status"]) == (submitted["id"], "completed")
    assert shown["outputs"]["writer.draft.one"] == {"text": "hello"}
    assert shown["progress"] == {"steps_total": 3, "steps_finished": 3, "percent": 100.0}


@pytest.mark.usefixtures("celery_worker")
def test_a_failing_plan_exits_1_and_prints_the_failure_as_it_happens(
    orch: Orch, tmp_path: Path
) -> None:
    plan = write(tmp_path / "doomed.yml", FAILING_YAML)

    watched = orch.run("runs", "submit", plan, "--watch", "--interval", "0.2")
    as_json = orch.json("runs", "submit", plan, "--watch", "--interval", "0.2", code=1)

    assert watched.returncode == 1, (watched.stdout, watched.stderr)
    lines = watched.stdout.splitlines()
    assert "FAILED worker.job.boom (attempt 1): invalid_input: bad input on purpose" in lines, lines
    assert re.fullmatch(r"run \S+ failed: invalid_input: .*bad input on purpose", lines[-1])
    assert as_json["status"] == "failed"
    assert as_json["last_error"]["code"] == "invalid_input"
    retried = orch.json("runs", "retry", as_json["id"])
    assert retried["status"] == "retrying"
    # The worker is the session's: let the retried attempt end (it fails again) before
    # the database is emptied, or its writes race the teardown's TRUNCATE (a deadlock
    # seen once in make test).
    wait_until(
        lambda: Run.objects.filter(pk=as_json["id"], attempt_number=2, status="failed").exists(),
        timeout=60,
        what="the retried attempt to fail again",
    )


@pytest.mark.usefixtures("celery_worker")
def test_a_cancelled_run_exits_1(orch: Orch, tmp_path: Path) -> None:
    plan = write(tmp_path / "sleeper.json", factories.sleeper_plan(30))
    watching = orch.start("runs", "submit", plan, "--watch", "--interval", "0.2")
    try:
        run_id = read_until(watching, r"run (\S+) \(sleeper\) created")[1]
        read_until(watching, r"^\[running\]")

        cancelled = orch.json("runs", "cancel", run_id, "--reason", "not today")
        code = watching.wait(timeout=30)
    finally:
        watching.kill()
        out, _ = watching.communicate()

    assert cancelled["status"] == "cancelled"
    assert code == 1
    assert out.splitlines()[-1] == f"run {run_id} cancelled: not today"


@pytest.mark.usefixtures("celery_worker")
def test_a_step_waiting_for_approval_is_approved_or_rejected(
    orch: Orch, client: Client, tmp_path: Path
) -> None:
    plan = write(tmp_path / "sign-off.json", factories.approval_plan())
    watching = orch.start("runs", "submit", plan, "--watch", "--interval", "0.2")
    try:
        run_id = read_until(watching, r"run (\S+) \(sign-off\) created")[1]
        waiting = read_until(watching, r"WAITING agent-0\.task-0\.gate \(step (\d+)\) for approval")
        approved = orch.json("runs", "approve", run_id, "--step", waiting[1], "--comment", "ok")
        code = watching.wait(timeout=30)
    finally:
        watching.kill()
        watching.communicate()
    rejected_run = client.submit(factories.approval_plan())
    reaches(client, rejected_run["id"], "waiting_approval")
    rejected = orch.json("runs", "reject", rejected_run["id"], "--comment", "no")
    after = orch.run("runs", "watch", rejected_run["id"], "--interval", "0.2")

    assert approved["steps"] == [int(waiting[1])]
    assert code == 0
    assert len(rejected["steps"]) == 1
    assert after.returncode == 1
    assert "approval_rejected" in after.stdout


@pytest.mark.usefixtures("celery_worker")
def test_events_follow_until_the_run_ends_named_by_path_and_attempt(
    orch: Orch, client: Client
) -> None:
    run = client.submit(factories.sleeper_plan(0.5))

    followed = orch.run("runs", "events", run["id"], "--follow", "--json", "--interval", "0.2")
    text = orch.run("runs", "events", run["id"])
    listed = orch.json("runs", "events", run["id"], "--kind", "transition")

    assert followed.returncode == 0, followed.stderr
    events = [json.loads(line) for line in followed.stdout.splitlines()]
    run_states = [e["to_status"] for e in events if e["entity"] == "run" and e["to_status"]]
    assert run_states[-1] == "completed"
    started = [e for e in events if e["entity"] == "step" and e["to_status"] == "running"]
    assert (started[0]["path"], started[0]["payload"]["attempt"]) == ("agent-0.task-0.nap", 1)
    assert [e["id"] for e in events] == sorted({e["id"] for e in events})
    assert "agent-0.task-0.nap (attempt 1)  running -> completed" in text.stdout
    assert {e["kind"] for e in listed} == {"transition"}


@pytest.mark.usefixtures("celery_worker")
def test_every_command_prints_json_for_scripts(orch: Orch, client: Client, tmp_path: Path) -> None:
    run = client.submit(factories.sleeper_plan(30))
    reaches(client, run["id"], "running")

    paused = orch.json("runs", "pause", run["id"])
    resumed = orch.json("runs", "resume", run["id"])
    cancelled = orch.json("runs", "cancel", run["id"])
    listed = orch.json("runs", "ls", "--status", "cancelled")
    shown = orch.json("runs", "show", run["id"])
    events = orch.json("runs", "events", run["id"])
    balance = orch.json("balance")
    ledger = orch.json("ledger", "--run", run["id"])
    text_balance = orch.run("balance")
    text_ledger = orch.run("ledger")
    text_ls = orch.run("runs", "ls")
    text_show = orch.run("runs", "show", run["id"])

    assert paused["status"] == "paused"
    assert resumed["status"] in ("resuming", "running")
    assert cancelled["status"] == "cancelled"
    assert [r["id"] for r in listed] == [run["id"]]
    assert shown["status"] == "cancelled"
    assert events[0]["kind"] == "created"
    assert balance["reserved"] == "0.000000"
    assert {entry["type"] for entry in ledger} >= {"reserve", "refund"}
    assert "AVAILABLE" in text_balance.stdout
    assert "1000" in text_balance.stdout
    assert "grant" in text_ledger.stdout
    assert run["id"] in text_ls.stdout
    assert "status    cancelled" in text_show.stdout


def test_a_run_is_forked_with_an_edited_plan_read_from_yaml_as_submit_reads_it(
    orch: Orch, tenant: LiveTenant, tmp_path: Path
) -> None:
    """`--plan` took JSON only (`not JSON: Expecting value`) while `runs submit` takes YAML."""
    failed = states.failed(tenant.organization)
    plan = Run.objects.get(pk=failed.pk).plan
    plan["agents"][0]["tasks"][0]["steps"][1]["params"] = {"text": "edited in YAML"}
    edited = write(tmp_path / "edited.yaml", yaml.safe_dump(plan, sort_keys=False))

    preview = orch.json("runs", "fork", str(failed.pk), "--from", "agent-0.task-0.step-1",
                        "--plan", edited, "--dry-run")  # fmt: skip
    forked = orch.json("runs", "fork", str(failed.pk), "--from", "agent-0.task-0.step-1",
                       "--plan", edited, "--no-start")  # fmt: skip

    assert preview["run"] == ["agent-0.task-0.step-0", "agent-0.task-0.step-1"]  # none completed
    assert forked["status"] == "created"
    assert forked["forked_from"] == {"run": str(failed.pk), "step": "agent-0.task-0.step-1"}
    fork_plan = Run.objects.get(pk=forked["id"]).plan
    assert fork_plan["agents"][0]["tasks"][0]["steps"][1]["params"] == {"text": "edited in YAML"}


def test_a_failed_run_is_forked_dry_and_retried_reusing_what_completed(
    orch: Orch, tenant: LiveTenant
) -> None:
    failed = states.failed(tenant.organization)

    preview = orch.json("runs", "fork", str(failed.pk), "--from", "agent-0.task-0.step-1",
                        "--dry-run")  # fmt: skip
    forked = orch.json("runs", "fork", str(failed.pk), "--from", "agent-0.task-0.step-0",
                       "--no-start", "--variables", '{"topic": "chips"}')  # fmt: skip
    retried = orch.json("runs", "retry", str(failed.pk), "--reuse-completed")

    assert preview == {
        "reuse": [],  # nothing completed in the source
        "run": ["agent-0.task-0.step-0", "agent-0.task-0.step-1"],
        "reservation": "0.060000",
    }
    assert forked["status"] == "created"
    assert forked["forked_from"] == {"run": str(failed.pk), "step": "agent-0.task-0.step-0"}
    assert forked["variables"] == {"topic": "chips"}
    assert retried["status"] == "retrying"
    assert Run.objects.get(pk=failed.pk).forks.count() == 1
