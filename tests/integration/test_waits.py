"""Child runs, callbacks and polls with real processes: the Celery worker runs the
steps and the polls, children tell their parents through the broker, and callbacks are
posted to the API as an outside service would."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from rest_framework.test import APIClient

from artifacts.models import Artifact
from billing.services import api_key_create
from runs.models import Run, RunnerJob, StepWait
from runs.states import RunStatus
from runs.waits import callbacks
from runs.waits.callbacks import POLL_BODY_LIMIT
from tests.http_fixture import HttpServer, gzip_bomb
from tests.integration.engine_support import assert_books_balanced, steps_of, submit, wait_for
from tests.support import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]

ENDED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


def plan_of(*steps: dict[str, Any], mode: str = "sequential", **extra: Any) -> dict[str, Any]:
    task = {"name": "t", "mode": mode, "max_concurrent_steps": 10, "steps": list(steps)}
    return {"name": "p", "agents": [{"name": "a", "tasks": [task]}], **extra}


ONE = {"name": "one", "tool": "echo", "params": {"n": "${variables.n}"}}


def child(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return plan_of(*(steps or (ONE,)), variables={"n": 0}, **extra)


def spawn(name: str, mode: str, plan: Any, **extra: Any) -> dict[str, Any]:
    params = {"plan": plan, "execution_mode": mode, **extra.pop("params", {})}
    return {"name": name, "tool": "run", "params": params, **extra}


def echo_callback(name: str = "seen") -> list[dict[str, Any]]:
    return [{"name": name, "tool": "echo", "params": {
        "status": "${callback.status}", "outputs": "${callback.outputs}",
        "child": "${callback.child_run}", "error": "${callback.error}",
    }}]  # fmt: skip


def children_of(run: Run) -> dict[str, Run]:
    rows = Run.objects.filter(parent_run=run).select_related("parent_step")
    return {row.parent_step.name: row for row in rows if row.parent_step}


def client_of(run: Run, scope: str = "full") -> APIClient:
    _, key = api_key_create(organization=run.organization, scope=scope)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


# --------------------------------------------------------------------------- child runs
def test_every_child_mode_end_to_end() -> None:
    parent = submit(
        plan_of(
            spawn("sync", "sync", child(), params={"variables": {"n": 1}}),
            spawn("poll", "async_poll", child(), params={"variables": {"n": 2}}),
            spawn("back", "async_callback", child(), on_callback=echo_callback(),
                  params={"variables": {"n": 3}}),
            mode="parallel",
        )
    )  # fmt: skip
    parent = wait_for(parent)
    assert parent.status == RunStatus.COMPLETED, parent.last_error
    kids = children_of(parent)
    for kid in kids.values():
        wait_for(kid)
    steps = steps_of(parent)

    sync = kids["sync"]
    assert steps["sync"].output == {
        "child_run": str(sync.pk),
        "status": "completed",
        "outputs": {"a.t.one": {"n": 1}},
    }
    assert steps["poll"].output == {"child_run": str(kids["poll"].pk)}
    assert steps["back"].output == {"child_run": str(kids["back"].pk)}
    assert steps["back.on_callback.seen"].output == {
        "status": "completed",
        "outputs": {"a.t.one": {"n": 3}},
        "child": str(kids["back"].pk),
        "error": None,
    }
    assert {kid.depth for kid in kids.values()} == {1}

    client = client_of(parent)
    detail = client.get(f"/api/v1/runs/{parent.pk}").json()
    assert {c["id"] for c in detail["children"]} == {str(kid.pk) for kid in kids.values()}
    assert {c["mode"] for c in detail["children"]} == {"sync", "async_poll", "async_callback"}
    assert detail["outputs"]["a.t.sync"]["child_run"] == str(sync.pk)
    assert detail["parent_run"] is None
    child_detail = client.get(f"/api/v1/runs/{sync.pk}").json()
    assert child_detail["parent_run"] == str(parent.pk)
    assert child_detail["depth"] == 1
    listed = client.get("/api/v1/runs", {"parent_run": str(parent.pk)}).json()
    assert {row["id"] for row in listed["results"]} == {str(kid.pk) for kid in kids.values()}
    for run in (parent, *kids.values()):
        assert_books_balanced(run)


def test_concurrent_callbacks_and_callbacks_on_failure() -> None:
    failing = child({"name": "one", "tool": "fail", "params": {"code": "invalid_input"}})
    steps = [
        spawn(f"k{i}", "async_callback", failing if i % 2 else child(),
              on_callback=echo_callback())
        for i in range(6)
    ]  # fmt: skip
    parent = wait_for(submit(plan_of(*steps, mode="parallel")))

    assert parent.status == RunStatus.COMPLETED, parent.last_error
    seen = {
        name.split(".")[0]: step.output
        for name, step in steps_of(parent).items()
        if name.endswith(".seen")
    }
    assert {name: out["status"] for name, out in seen.items()} == {
        f"k{i}": "failed" if i % 2 else "completed" for i in range(6)
    }
    assert all(seen[f"k{i}"]["error"]["code"] == "invalid_input" for i in (1, 3, 5))
    for run in (parent, *children_of(parent).values()):
        assert_books_balanced(run)


def test_a_failed_child_fails_its_sync_step() -> None:
    failing = child({"name": "one", "tool": "fail", "params": {"message": "it broke"}})
    parent = wait_for(submit(plan_of(spawn("sync", "sync", failing))))

    assert parent.status == RunStatus.FAILED
    error = steps_of(parent)["sync"].error
    assert error["code"] == "child_failed"
    assert "it broke" in error["message"]
    assert_books_balanced(parent)


def test_children_nest_until_run_max_depth_then_fail_their_step(settings: Any) -> None:
    # Each run starts a child of the same plan: only RUN_MAX_DEPTH stops it.
    again = plan_of(spawn("deeper", "sync", "${variables.again}",
                          params={"variables": {"again": "${variables.again}"}}))  # fmt: skip
    top = wait_for(submit({**again, "variables": {"again": again}}), timeout=120)

    chain = [top]
    while (nxt := Run.objects.filter(parent_run=chain[-1]).first()) is not None:
        chain.append(nxt)
    assert [run.depth for run in chain] == list(range(settings.RUN_MAX_DEPTH + 1))
    deepest = steps_of(chain[-1])["deeper"]
    assert deepest.error["code"] == "run_depth_exceeded"
    assert [Run.objects.get(pk=r.pk).status for r in chain] == ["failed"] * len(chain)
    assert steps_of(top)["deeper"].error["code"] == "child_failed"
    for run in chain:
        assert_books_balanced(run)


def test_cancelling_a_parent_cascades_to_its_children_and_their_runner_jobs() -> None:
    waits = child({"name": "job", "tool": "runner", "params": {"prompt": "work"}})
    sleeps = child({"name": "nap", "tool": "sleep", "params": {"seconds": 60}, "timeout": 120})
    parent = submit(
        plan_of(
            spawn("sync", "sync", waits, timeout=120),
            spawn("poll", "async_poll", sleeps),
            mode="parallel",
        )
    )

    def both_waiting() -> bool:
        kids = children_of(parent)
        return len(kids) == 2 and RunnerJob.objects.filter(run=kids.get("sync")).exists()

    wait_until(both_waiting, timeout=60, what="both children to start")
    response = client_of(parent).post(f"/api/v1/runs/{parent.pk}/cancel", {}, format="json")
    assert response.status_code == 200

    kids = children_of(parent)
    assert {name: wait_for(kid).status for name, kid in kids.items()} == {
        "sync": RunStatus.CANCELLED,
        "poll": RunStatus.CANCELLED,
    }
    job = RunnerJob.objects.get(run=kids["sync"])
    assert job.status == "stopped"  # no runner had claimed it
    for run in (parent, *kids.values()):
        assert_books_balanced(wait_for(run))


# --------------------------------------------------------------------------- callbacks
def hook(http_server: HttpServer, **params: Any) -> dict[str, Any]:
    request = {"url": f"{http_server.url}/builds", "method": "POST",
               "json": {"notify": "${callback.url}"}}  # fmt: skip
    return {"name": "hook", "tool": "callback", "params": {"request": request, **params}}


def callback_path(http_server: HttpServer) -> str:
    def sent() -> str | None:
        posts = [r for r in http_server.requests if r.path == "/builds"]
        return posts[-1].json()["notify"] if posts else None

    url = wait_until(sent, timeout=30, what="the callback step's request")
    return url[url.index("/api/v1/callbacks/") :]


def test_a_callback_url_ends_its_step_once(http_server: HttpServer) -> None:
    http_server.respond("/builds", status=202, json={"queued": True})
    run = submit(plan_of(hook(http_server), {"name": "after", "tool": "echo",
                         "params": {"got": "${steps.hook.output}"}}))  # fmt: skip
    path = callback_path(http_server)
    public = APIClient()  # no key: the token is the credential

    head, _, secret = path.rpartition("/")[2].partition(".")
    wrong = public.post(
        f"/api/v1/callbacks/{head}.{secret[::-1]}", {"status": "completed"}, format="json"
    )
    assert wrong.status_code == 404
    bad = public.post(path, {"status": "maybe"}, format="json")
    assert bad.status_code == 400
    assert bad.json()["code"] == "invalid_request"
    posted = public.post(path, {"status": "completed", "result": {"build": 7}}, format="json")
    assert posted.status_code == 200
    assert posted.json() == {"ok": True}
    again = public.post(path, {"status": "completed", "result": {"build": 8}}, format="json")
    assert again.status_code == 409
    assert again.json()["code"] == "callback_used"

    run = wait_for(run)
    assert run.status == RunStatus.COMPLETED
    assert steps_of(run)["after"].output == {"got": {"build": 7}}
    assert_books_balanced(run)


def test_an_expired_callback_times_its_step_out(http_server: HttpServer) -> None:
    http_server.respond("/builds", status=202)
    run = submit(plan_of(hook(http_server, timeout=0.5) | {"retry": {"max_attempts": 1}}))
    path = callback_path(http_server)

    wait_until(lambda: callbacks.sweep()["expired"], timeout=30, what="the callback to expire")
    late = APIClient().post(path, {"status": "completed"}, format="json")
    assert late.status_code in (409, 410)
    run = wait_for(run)
    assert run.status == RunStatus.FAILED
    assert steps_of(run)["hook"].error["cause"] == "timeout"
    assert_books_balanced(run)


def test_a_failed_callback_is_retried_with_a_new_url(http_server: HttpServer) -> None:
    http_server.respond("/builds", status=202)
    run = submit(plan_of(hook(http_server) | {"retry": {"max_attempts": 2, "base_delay_ms": 0}}))
    first = callback_path(http_server)
    failed = APIClient().post(first, {"status": "failed", "error": "red build"}, format="json")
    assert failed.status_code == 200

    def second_url() -> str | None:
        path = callback_path(http_server)
        return path if path != first else None

    second = wait_until(second_url, timeout=30, what="the retry's request")
    done = APIClient().post(second, {"status": "completed", "result": 1}, format="json")
    assert done.status_code == 200
    run = wait_for(run)
    assert run.status == RunStatus.COMPLETED
    assert steps_of(run)["hook"].attempts == 2
    assert_books_balanced(run)


def test_a_callback_without_a_request_is_ended_by_its_id_with_a_full_key() -> None:
    run = submit(plan_of({"name": "hook", "tool": "callback", "params": {"timeout": 60}}))
    client = client_of(run)

    def callback_id() -> str | None:
        events = client.get(f"/api/v1/runs/{run.pk}/events", {"kind": "wait"}).json()
        found = [e["payload"]["wait"] for e in events["results"] if e["payload"].get("wait")]
        return found[0] if found else None

    wait_id = wait_until(callback_id, timeout=30, what="the callback's event")
    events = client.get(f"/api/v1/runs/{run.pk}/events").content
    assert b"/api/v1/callbacks/" not in events  # its URL, a credential, is not shown
    body = {"callback": wait_id, "status": "completed", "result": "signed"}
    reader = client_of(run, scope="read")
    refused = reader.post(f"/api/v1/runs/{run.pk}/callback", body, format="json")
    assert refused.status_code == 403
    answer = client.post(f"/api/v1/runs/{run.pk}/callback", body, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"ok": True}
    assert wait_for(run).status == RunStatus.COMPLETED
    assert steps_of(run)["hook"].output == "signed"


# --------------------------------------------------------------------------- polls
def watch(http_server: HttpServer, **params: Any) -> dict[str, Any]:
    return {"name": "watch", "tool": "poll", "params": {
        "url": f"{http_server.url}/job", "interval": 0.1, "max_attempts": 20,
        "done_when": "${response.body.state} == 'done'",
        "failed_when": "${response.status} == 200 and ${response.body.state} == 'broken'",
        **params,
    }}  # fmt: skip


def test_a_poll_reads_until_done(http_server: HttpServer) -> None:
    http_server.respond("/job", status=503, times=1)
    http_server.respond("/job", json={"state": "running"}, times=2)
    http_server.respond("/job", json={"state": "done", "result": 42})
    run = wait_for(submit(plan_of(watch(http_server))))

    assert run.status == RunStatus.COMPLETED, run.last_error
    output = steps_of(run)["watch"].output
    assert output["polls"] == 4
    assert output["body"] == {"state": "done", "result": 42}
    assert len([r for r in http_server.requests if r.path == "/job"]) == 4
    assert_books_balanced(run)


@pytest.mark.parametrize(
    ("answer", "code"),
    [({"state": "broken"}, "poll_failed"), ({"state": "running"}, "poll_exhausted")],
)
def test_a_poll_fails_by_its_condition_or_its_attempts(
    http_server: HttpServer, answer: dict[str, str], code: str
) -> None:
    http_server.respond("/job", json=answer)
    run = wait_for(submit(plan_of(watch(http_server, max_attempts=3))))

    assert run.status == RunStatus.FAILED
    assert steps_of(run)["watch"].error["code"] == code
    assert_books_balanced(run)


def test_a_poll_of_a_server_answering_a_gzip_bomb_ends_at_its_timeout(
    http_server: HttpServer,
) -> None:
    # Each reading's body inflates to NUL characters: cut at the poll's body limit and
    # stored readable, each reading is counted, and the step ends at its timeout.
    http_server.respond("/job", body=gzip_bomb(), headers={"Content-Encoding": "gzip"})
    step = {**watch(http_server, timeout="2s", max_attempts=1000), "retry": {"max_attempts": 1}}
    run = wait_for(submit(plan_of(step)), timeout=30)

    assert run.status == RunStatus.FAILED
    failed = steps_of(run)["watch"]
    assert failed.error["cause"] == "timeout"
    wait = StepWait.objects.get(step=failed)
    assert wait.polls >= 2
    last = wait.last_response
    # The last reading had only what was left of the timeout, and may have been cut by it.
    assert last.get("body") == "\ufffd" * POLL_BODY_LIMIT or last["error"].startswith("timeout")
    assert_books_balanced(run)


# --------------------------------------------------------------------------- artifacts
def test_an_http_step_saves_its_response_as_an_artifact(http_server: HttpServer) -> None:
    body = bytes(range(256)) * 8192  # 2 MiB: past the spool's memory, and any JSON
    http_server.respond("/export.bin", body=body, headers={"Content-Type": "application/x-export"})
    params = {"url": f"{http_server.url}/export.bin", "save_as": "export.bin"}
    step = {"name": "get", "tool": "http", "params": params}
    run = wait_for(submit(plan_of(step)))

    assert run.status == RunStatus.COMPLETED, run.last_error
    artifact = Artifact.objects.get(run=run)
    output = steps_of(run)["get"].output
    assert output["status"] == 200
    assert output["artifact"]["id"] == str(artifact.pk)
    assert output["artifacts"] == [str(artifact.pk)]
    assert "body" not in output
    assert (artifact.name, artifact.size, artifact.step_id) == (
        "export.bin",
        len(body),
        steps_of(run)["get"].pk,
    )
    assert artifact.sha256 == hashlib.sha256(body).hexdigest()
    client = client_of(run)
    listed = client.get(f"/api/v1/runs/{run.pk}/artifacts").json()["results"]
    assert [row["id"] for row in listed] == [str(artifact.pk)]
    assert listed[0]["expires_at"] is not None  # the run has ended
    download = client.get(f"/api/v1/artifacts/{artifact.pk}/download")
    assert b"".join(download.streaming_content) == body  # type: ignore[attr-defined]
