"""The Python client over real HTTP: against the live API (no worker: runs stay where the
API leaves them), and against a scripted local server for what the API will not do on
demand (transient failures, Retry-After, a connection refused)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator_client import (
    ApiError,
    AuthenticationFailed,
    BadRequest,
    Client,
    InvalidPlan,
    InvalidTransition,
    NotFound,
    RateLimited,
    ServerError,
    TransportError,
    config,
)
from orchestrator_client.plans import PlanFile, PlanFileError, json_body, yaml_body
from tests import factories
from tests.http_fixture import HttpServer
from tests.support import free_port
from tests.tenants import LiveTenant

live = pytest.mark.django_db(transaction=True)

PLAN_YAML = """\
# a plan, as people write it
name: from-yaml
variables: {topic: chips}
agents:
  - name: researcher
    tasks:
      - name: fetch
        steps:
          - {name: topic, tool: echo, params: {topic: "${variables.topic}"}}
"""


# --------------------------------------------------------------------------- the live API
@live
def test_a_run_is_submitted_read_listed_and_controlled(client: Client) -> None:
    submitted = client.submit(factories.plan(name="submitted"))
    created = client.create_run(factories.plan(name="created"))

    assert submitted["status"] == "pending"
    assert created["status"] == "created"
    assert client.get_run(submitted["id"])["name"] == "submitted"
    assert [run["name"] for run in client.runs()] == ["created", "submitted"]
    assert [run["id"] for run in client.runs(status="created")] == [created["id"]]
    assert client.start_run(created["id"])["status"] == "pending"
    cancelled = client.cancel_run(created["id"], reason="changed my mind")
    assert (cancelled["status"], cancelled["cancel_reason"]) == ("cancelled", "changed my mind")
    assert client.approve(submitted["id"])["steps"] == []


@live
def test_the_same_idempotency_key_creates_one_run(client: Client) -> None:
    plan = factories.plan(name="once")

    first = client.submit(plan, idempotency_key="my-key-1")
    again = client.submit(plan, idempotency_key="my-key-1")
    other = client.submit(plan)

    assert again["id"] == first["id"]
    assert other["id"] != first["id"]
    assert len(client.runs().all()) == 2


@live
def test_iterators_follow_every_page_and_cursor(client: Client) -> None:
    runs = [client.create_run(factories.plan(name=f"run-{n}")) for n in range(5)]
    client.cancel_run(runs[0]["id"])

    listed = client.runs(page_size=2)
    assert [run["id"] for run in listed] == [run["id"] for run in reversed(runs)]
    assert [len(page["results"]) for page in listed.pages()] == [2, 2, 1]
    assert len(list(client.runs(page_size=2, limit=3))) == 3

    events = client.events(runs[0]["id"], page_size=1)  # by cursor, one event a page
    every = events.all()
    assert [event["kind"] for event in every][:1] == ["created"]
    assert [event["to_status"] for event in every if event["entity"] == "run"][-1] == "cancelled"
    assert [event["id"] for event in every] == sorted(event["id"] for event in every)
    assert len(list(events.pages())) >= len(every)
    after = client.events(runs[0]["id"], after=every[0]["id"]).all()
    assert after == every[1:]


@live
def test_plan_files_are_sent_as_written_json_or_yaml(client: Client, tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(PLAN_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(factories.plan(name="from-json")))
    (tmp_path / "plan").write_text("name: no-suffix\n" + PLAN_YAML.split("\n", 2)[2])

    from_yaml = client.submit_file(tmp_path / "plan.yaml")
    from_json = client.submit_file(tmp_path / "plan.json", start=False)
    sniffed = client.submit_file(tmp_path / "plan")

    assert (from_yaml["name"], from_yaml["status"]) == ("from-yaml", "pending")
    assert from_yaml["plan"] == yaml.safe_load(PLAN_YAML)
    assert (from_json["name"], from_json["status"]) == ("from-json", "created")
    assert sniffed["name"] == "no-suffix"
    with pytest.raises(BadRequest) as bad_yaml:
        client.submit_text("name: [unclosed\n", format="yaml")
    assert bad_yaml.value.code == "invalid_yaml"
    with pytest.raises(BadRequest) as bad_json:
        client.submit_text('{"name": ', format="json")
    assert bad_json.value.code == "invalid_json"


@live
def test_api_errors_are_exceptions_with_code_details_and_status(
    client: Client, tenant: LiveTenant
) -> None:
    plan = factories.plan()
    plan["agents"][0]["tasks"][0]["steps"][0]["tool"] = "ech"

    with pytest.raises(InvalidPlan) as invalid:
        client.submit(plan)
    with pytest.raises(NotFound) as missing:
        client.get_run(str(uuid.uuid4()))
    run = client.cancel_run(client.create_run(factories.plan())["id"])
    with pytest.raises(InvalidTransition) as refused:
        client.pause_run(run["id"])
    with (
        Client(tenant.url, "ork_nope_nope") as stranger,
        pytest.raises(AuthenticationFailed) as who,
    ):
        stranger.balance()

    assert (invalid.value.status, invalid.value.code) == (400, "invalid_plan")
    assert invalid.value.details[0]["path"] == "agents[0].tasks[0].steps[0].tool"
    assert (missing.value.status, missing.value.code, missing.value.details) == (
        404,
        "not_found",
        None,
    )
    assert refused.value.details == {"entity": "run", "from": "cancelled", "to": "paused"}
    assert (who.value.status, who.value.code) == (401, "authentication_failed")
    assert isinstance(refused.value, ApiError)


@live
def test_billing_organization_secrets_runners_and_escalations(client: Client) -> None:
    client.submit(factories.plan(steps=1))

    balance = client.balance()
    entries = client.ledger().all()
    organization = client.organization()
    client.put_secret("API_TOKEN", "s3cret")
    secrets = client.secrets().all()
    client.delete_secret("API_TOKEN")

    assert balance["total"] == "1000.000000"
    assert balance["reserved"] != "0.000000"  # the run started
    assert [entry["type"] for entry in entries] == ["reserve", "grant"]
    assert client.ledger(type="grant").all()[0]["amount"] == "1000.000000"
    assert organization["limits"]["max_running_runs"] >= 1
    assert [secret["name"] for secret in secrets] == ["API_TOKEN"]
    assert "value" not in secrets[0]
    assert client.secrets().all() == []
    with pytest.raises(NotFound):
        client.delete_secret("API_TOKEN")
    assert client.runners().all() == []
    assert client.escalations().all() == []


@live
def test_artifacts_are_uploaded_listed_downloaded_and_deleted(client: Client) -> None:
    run = client.create_run(factories.plan())

    artifact = client.upload_artifact(run["id"], "notes.txt", b"hello", content_type="text/plain")
    started = client.start_artifact_upload(run["id"], "big.bin", 3)
    client.send_artifact_content(started["artifact"]["id"], b"abc")
    completed = client.complete_artifact_upload(started["artifact"]["id"])

    assert (artifact["name"], artifact["size"], artifact["status"]) == ("notes.txt", 5, "available")
    assert completed["status"] == "available"
    assert sorted(a["name"] for a in client.artifacts(run["id"])) == ["big.bin", "notes.txt"]
    assert client.download_artifact(artifact["id"]) == b"hello"
    assert client.get_artifact(completed["id"])["sha256"]
    client.delete_artifact(artifact["id"])
    with pytest.raises(NotFound):
        client.get_artifact(artifact["id"])


# --------------------------------------------------------------------------- retries
class Waits:
    """Stands in for time.sleep: records how long the client asked to wait."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def scripted(server: HttpServer, waits: Waits, **options: Any) -> Client:
    return Client(server.url, "ork_test", timeout=5, sleep=waits, **options)


CREATED = {"id": "r1", "status": "pending"}


def error(code: str, details: Any = None) -> dict[str, Any]:
    return {"code": code, "message": f"scripted {code}", "details": details}


def test_a_post_is_retried_under_one_idempotency_key(http_server: HttpServer) -> None:
    http_server.respond("/api/v1/runs", status=503, json=error("service_unavailable"), times=1)
    http_server.respond("/api/v1/runs", status=502, body="<html>bad gateway</html>", times=1)
    http_server.respond("/api/v1/runs", status=201, json=CREATED)
    waits = Waits()

    with scripted(http_server, waits) as client:
        run = client.submit(factories.plan())
        client.submit(factories.plan())

    assert dict(run) == CREATED
    keys = [request.headers["idempotency-key"] for request in http_server.requests]
    assert len(keys) == 4
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert len(waits.seconds) == 2
    assert all(0 < wait <= 8 for wait in waits.seconds)
    assert http_server.requests[0].headers["authorization"] == "Bearer ork_test"


def test_retry_after_is_honoured(http_server: HttpServer) -> None:
    throttled = error("throttled", {"retry_after": 3})
    in_use = error("idempotency_key_in_use")
    balance, cancel = "/api/v1/billing/balance", "/api/v1/runs/r1/cancel"
    http_server.respond(balance, status=429, headers={"Retry-After": "3"}, json=throttled, times=1)
    http_server.respond(cancel, status=409, headers={"Retry-After": "1"}, json=in_use, times=1)
    http_server.respond("/api/v1/billing/balance", json={"available": "1"})
    http_server.respond("/api/v1/runs/r1/cancel", json=CREATED)
    waits = Waits()

    with scripted(http_server, waits) as client:
        assert client.balance() == {"available": "1"}
        assert dict(client.cancel_run("r1")) == CREATED

    assert waits.seconds == [3.0, 1.0]
    cancels = [r for r in http_server.requests if r.path.endswith("/cancel")]
    assert cancels[0].headers["idempotency-key"] == cancels[1].headers["idempotency-key"]


def test_a_retry_after_beyond_what_we_wait_is_raised_at_once(http_server: HttpServer) -> None:
    pending = error("too_many_pending_runs", {"retry_after": 600})
    http_server.respond("/api/v1/runs", status=429, headers={"Retry-After": "600"}, json=pending)
    waits = Waits()

    with scripted(http_server, waits) as client, pytest.raises(RateLimited) as limited:
        client.submit(factories.plan())

    assert (limited.value.code, limited.value.retry_after) == ("too_many_pending_runs", 600.0)
    assert limited.value.details == {"retry_after": 600}
    assert (len(http_server.requests), waits.seconds) == (1, [])


def test_client_errors_are_not_retried_and_server_errors_give_up(
    http_server: HttpServer,
) -> None:
    invalid = error("invalid_request", [{"path": "plan", "message": "x"}])
    http_server.respond("/api/v1/runs", status=400, json=invalid)
    http_server.respond("/api/v1/organization", status=504, body="gateway timeout")
    waits = Waits()

    with scripted(http_server, waits, retries=2) as client:
        with pytest.raises(BadRequest) as refused:
            client.submit(factories.plan())
        with pytest.raises(ServerError) as failed:
            client.organization()

    assert refused.value.details == [{"path": "plan", "message": "x"}]
    assert (failed.value.status, failed.value.code) == (504, "http_504")
    assert "gateway timeout" in failed.value.message
    assert [r.path for r in http_server.requests] == ["/api/v1/runs"] + ["/api/v1/organization"] * 3
    assert len(waits.seconds) == 2


def test_a_post_without_a_key_is_retried_only_when_it_cannot_have_happened(
    http_server: HttpServer,
) -> None:
    upload = "/api/v1/runs/r1/artifacts"
    http_server.respond(upload, status=503, json=error("service_unavailable"), times=1)
    http_server.respond(upload, status=502, body="bad gateway")
    waits = Waits()

    with scripted(http_server, waits) as client, pytest.raises(ServerError) as failed:
        client.upload_artifact("r1", "a.txt", b"abc")

    assert failed.value.status == 502
    assert len(http_server.requests) == 2  # the 503 retried, the 502 not
    assert all(b"abc" in request.body for request in http_server.requests)
    assert "idempotency-key" not in http_server.requests[0].headers


def test_a_server_that_cannot_be_reached_is_a_transport_error_after_the_retries() -> None:
    waits = Waits()

    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    with (
        Client(nowhere, "ork_x", retries=2, sleep=waits) as client,
        pytest.raises(TransportError) as unreachable,
    ):
        client.balance()

    assert unreachable.value.code == "connection_failed"
    assert len(waits.seconds) == 2


def test_an_answer_that_is_not_json_is_an_api_error(http_server: HttpServer) -> None:
    http_server.respond("/api/v1/billing/balance", body="<html>a web page</html>")

    with scripted(http_server, Waits()) as client, pytest.raises(ApiError) as wrong:
        client.balance()

    assert (wrong.value.status, wrong.value.code) == (200, "invalid_response")
    assert "a web page" in wrong.value.message


def test_a_next_link_to_another_host_is_followed_on_ours(http_server: HttpServer) -> None:
    elsewhere = "http://elsewhere.invalid/api/v1/runs/page?page=2"
    first = {"count": 2, "previous": None, "next": elsewhere, "results": [{"id": "a"}]}
    second = {"count": 2, "previous": None, "next": None, "results": [{"id": "b"}]}
    http_server.respond("/api/v1/runs", json=first)
    http_server.respond("/api/v1/runs/page", json=second)

    with scripted(http_server, Waits()) as client:
        assert [run["id"] for run in client.runs()] == ["a", "b"]

    assert http_server.requests[1].query == {"page": ["2"]}
    assert http_server.requests[1].headers["authorization"] == "Bearer ork_test"


# --------------------------------------------------------------------------- plan files
@pytest.mark.parametrize(
    "text",
    [
        PLAN_YAML,
        "%YAML 1.2\n---\n" + PLAN_YAML + "...\n",
        "# leading comment\n--- # the plan\n" + PLAN_YAML,
        "--- {name: flow, agents: [{name: a, tasks: []}]}\n",
        "name: scalars\nnote: |\n  line one\n\n    indented\nfolded: >-\n  a\n  b\n",
    ],
)
def test_a_yaml_plan_is_wrapped_without_changing_it(text: str) -> None:
    body = yaml.safe_load(yaml_body(text, start=True))

    assert body == {"start": True, "plan": yaml.safe_load(text.replace("%YAML 1.2\n", ""))}


def test_a_plan_file_is_refused_only_when_it_cannot_be_wrapped(tmp_path: Path) -> None:
    assert json.loads(json_body('\n{"name": "x"}\n', start=False)) == {
        "start": False,
        "plan": {"name": "x"},
    }
    with pytest.raises(PlanFileError, match="several documents"):
        yaml_body("name: a\n---\nname: b\n", start=True)
    with pytest.raises(PlanFileError, match="empty"):
        PlanFile.parse(b"  \n", name="plan.yaml")
    with pytest.raises(PlanFileError, match="not UTF-8"):
        PlanFile.parse(b"name: \xff\n", name="plan.yaml")
    with pytest.raises(PlanFileError, match="cannot read"):
        PlanFile.read(tmp_path / "missing.json")
    assert PlanFile.parse(b'\xef\xbb\xbf{"a": 1}', name="-").format == "json"


# --------------------------------------------------------------------------- config
def test_the_config_file_is_private_and_the_environment_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (config.CONFIG_ENV, config.URL_ENV, config.API_KEY_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))

    with pytest.raises(config.ConfigError, match="no URL and no API key"):
        config.load()
    path = config.save(config.Config(url="http://127.0.0.1:1", api_key="ork_a"))

    assert path == tmp_path / "xdg" / "orch" / "config.json"
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert config.load() == config.Config("http://127.0.0.1:1", "ork_a")
    monkeypatch.setenv(config.API_KEY_ENV, "ork_b")
    assert config.load() == config.Config("http://127.0.0.1:1", "ork_b")
    monkeypatch.setenv(config.CONFIG_ENV, str(tmp_path / "elsewhere.json"))
    monkeypatch.setenv(config.URL_ENV, "http://127.0.0.1:2")
    assert config.load() == config.Config("http://127.0.0.1:2", "ork_b")
    assert config.save(config.Config("http://x.test", "k")) == tmp_path / "elsewhere.json"
    assert sorted(os.listdir(tmp_path)) == ["elsewhere.json", "xdg"]  # no temporary left
