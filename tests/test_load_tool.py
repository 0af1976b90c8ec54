"""The pure parts of `make load`: the request mix, the tally and the report (no servers,
no locust: ``reliability.load_users`` is never imported here, since importing locust
monkey-patches the standard library with gevent)."""

from __future__ import annotations

import json
import random
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from reliability import load
from reliability.load_mix import (
    BAD_KINDS,
    UNEXPECTED_SAMPLES,
    Recorder,
    good_plan,
    invalid_plan,
    list_query,
    oversized_body,
)
from runs.plan import PlanInvalid, parse_plan

DOCS_API = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_importing_the_harness_does_not_import_locust() -> None:
    assert "locust" not in sys.modules


@pytest.mark.parametrize("seed", range(40))
def test_every_plan_the_users_send_is_valid(seed: int) -> None:
    parse_plan(good_plan(random.Random(seed), f"load-{seed}", slow=seed % 2 == 1))


@pytest.mark.parametrize("seed", range(40))
def test_every_invalid_plan_is_refused_by_the_validator(seed: int) -> None:
    with pytest.raises(PlanInvalid):
        parse_plan(invalid_plan(random.Random(seed), f"load-{seed}"))


def test_the_oversized_body_is_valid_json_over_the_body_limit() -> None:
    body = oversized_body()

    assert len(body.encode()) > settings.API_MAX_BODY_BYTES
    assert json.loads(body)["plan"]["name"] == "too-big"


def test_every_bad_kind_expects_a_status_and_code_the_api_documents() -> None:
    errors = DOCS_API.read_text()
    for kind, spec in BAD_KINDS.items():
        # In the errors table (`| 404 | `not_found` |`) or in prose (`403 insufficient_scope`).
        assert re.search(rf"{spec.status}\W+{spec.code}\b", errors), kind


def test_list_queries_only_use_documented_filters() -> None:
    documented = {"page_size", "status", "name", "priority", "ordering"}
    for seed in range(50):
        assert set(list_query(random.Random(seed))) <= documented


def test_the_recorder_counts_every_answer_and_keeps_a_bounded_sample_of_surprises() -> None:
    recorder = Recorder()

    assert recorder.saw("GET /runs", 200, frozenset({200}), "{}")
    for _ in range(UNEXPECTED_SAMPLES + 5):
        assert not recorder.saw("GET /runs [no_key]", 500, frozenset({401}), "boom", "no_key")

    result = recorder.as_dict()
    assert result["statuses"] == {"GET /runs": {"200": 1}, "GET /runs [no_key]": {"500": 55}}
    assert result["bad_requests"] == {"no_key": {"500": 55}}
    assert result["unexpected"] == UNEXPECTED_SAMPLES + 5
    assert len(result["unexpected_samples"]) == UNEXPECTED_SAMPLES


# --------------------------------------------------------------------------- the report
def _row(method: str, name: str, requests: int) -> dict[str, Any]:
    return {"method": method, "name": name, "requests": requests, "failures": 0,
            "rps": requests / 60, "avg_ms": 20.0, "p50_ms": 12, "p95_ms": 80, "p99_ms": 150,
            "max_ms": 400}  # fmt: skip


def _report(**statuses: dict[str, int]) -> dict[str, Any]:
    by_label = {"POST /runs": {"201": 90, "200": 10}, "GET /runs [no_key]": {"401": 5}}
    by_label.update({label.replace("_", " "): s for label, s in statuses.items()})
    checks = {
        "runs_by_status": {"cancelled": 10, "completed": 80},
        "runs_stuck": [],
        "ledgers_unsettled": [],
        "step_attempts_charged_twice": [],
        "invariants": {"clean": True, "violations": {}},
    }
    report: dict[str, Any] = {
        "config": {"users": 50, "orgs": 5, "web_workers": 4},
        "load": {
            "peak_users": 50, "ramp_s": 2.0, "window_s": 60.0, "duration_s": 64.0,
            "endpoints": [_row("POST", "/runs", 100), _row("GET", "/runs [no_key]", 5)],
            "total": _row("", "Aggregated", 105),
            "statuses": by_label,
            "bad_requests": {"no_key": {"401": 5}},
            "unexpected": 0, "unexpected_samples": [], "user_exceptions": [],
            "replays": {"ok": 10},
        },
        "runs": {
            "runs_seen_by_clients": 90, "runs_in_database": 90,
            "runs_missing_from_database": [], "runs_unseen_by_clients": [],
            "refused_but_stored": 0, "cross_tenant_events": [], "settle_s": 3.5,
            "checks": checks,
        },
        "worker_log_errors": {"lines": 0, "distinct": {}},
    }  # fmt: skip
    report["problems"] = load.problems(report)
    report["ok"] = not report["problems"]
    return report


def test_a_clean_run_passes_and_its_table_shows_latency_by_endpoint() -> None:
    report = _report()

    text = load.format_report(report)

    assert report["ok"]
    assert "| POST /runs | 100 | 1.7 | 12 | 80 | 150 | 400 | 201: 90, 200: 10 |" in text
    assert "| no_key | GET /runs: no Authorization header | 401 not_authenticated | 401: 5 |" in (
        text
    )
    assert "| verdict | PASS |" in text


def test_a_single_server_error_fails_the_run() -> None:
    report = _report(GET_runs={"200": 40, "500": 1})

    assert report["problems"] == ["1 answers with a 5xx status"]
    assert "| 5xx answers | 1 |" in load.format_report(report)


def test_a_stuck_run_or_a_wrong_replay_fails_the_run() -> None:
    report = _report()
    report["runs"]["checks"]["runs_stuck"] = ["1234 pending"]
    report["load"]["replays"] = {"ok": 9, "wrong answer": 1}

    assert load.problems(report) == [
        "idempotent replays: {'ok': 9, 'wrong answer': 1}",
        "1 runs stuck",
    ]


def test_status_totals_add_up_every_endpoint_in_numeric_order() -> None:
    statuses = {"GET /runs": {"200": 3, "404": 1}, "POST /runs": {"201": 2, "200": 1}}

    assert load.status_totals(statuses) == {"200": 4, "201": 2, "404": 1}
    assert load.server_errors(statuses) == 0


def test_an_error_in_the_web_servers_log_fails_the_run() -> None:
    report = _report()
    report["web_log_errors"] = ["2026-11-23 06:39:11 ERROR django.request Internal Server Error"]

    assert load.problems(report) == ["1 error lines in the web server's log"]


# --------------------------------------------------------------------------- capacity
def _phase(phase: str, requests: int, seconds: float, **statuses: dict[str, int]) -> dict[str, Any]:
    rows = [_row("GET", name.replace("_", " "), sum(s.values())) for name, s in statuses.items()]
    total = _row("", "Aggregated", requests)
    total["rps"] = requests / seconds
    return {
        "phase": phase, "users": 50, "peak_users": 50, "endpoints": rows, "total": total,
        "statuses": {f"GET {name.replace('_', ' ')}": s for name, s in statuses.items()},
        "unexpected": 0, "unexpected_samples": [], "user_exceptions": [],
    }  # fmt: skip


def _with_phases(
    floor_rps: float, reads_rps: float, mix_rps: float, saturated_rps: float = 80.0
) -> dict[str, Any]:
    report = _report()
    report["load"]["total"]["rps"] = mix_rps
    saturated = _phase("mix_saturated", int(saturated_rps * 20), 20, _runs={"201": 1})
    saturated["replays"] = {"ok": 3}
    report["phases"] = {
        "floor": _phase("floor", int(floor_rps * 20), 20, _load_floor={"200": 1}),
        "reads": _phase("reads", int(reads_rps * 20), 20, _runs={"200": 1}),
        "mix_saturated": saturated,
    }
    report["capacity"] = load.capacity(report)
    report["problems"] = load.problems(report)
    report["ok"] = not report["problems"]
    return report


def test_the_reads_and_the_saturated_mix_are_measured_as_fractions_of_the_floor() -> None:
    report = _with_phases(floor_rps=200.0, reads_rps=130.0, mix_rps=50.0, saturated_rps=60.0)

    figures = report["capacity"]

    assert [row["phase"] for row in figures["phases"]] == [
        "floor",
        "reads",
        "mix_saturated",
        "mix",
    ]
    assert figures["ratios"] == {"reads/floor": 0.65, "mix_saturated/floor": 0.3}
    assert [(g["phase"], g["goal"], g["met"]) for g in figures["goals"]] == [
        ("reads", 0.6, True),
        ("mix_saturated", 0.35, False),
    ]
    # The mix with its think time is the latency figure, held to no throughput goal:
    # 50 users waiting 0.5 s on average between requests send 100 requests/s at most.
    assert figures["mix_p95_ms"] == 80
    assert figures["mix_think_ceiling_rps"] == 100.0
    assert figures["mix_think_ceiling_of_floor"] == 0.5


def test_the_report_shows_the_phases_side_by_side_and_the_goals_met_or_not() -> None:
    report = _with_phases(floor_rps=200.0, reads_rps=100.0, mix_rps=50.0, saturated_rps=80.0)

    text = load.format_report(report)

    assert "| floor | none | 4000 | 200.0 | 12 | 80 | 150 | 0 | 1.00 |" in text
    assert "| reads | none | 2000 | 100.0 | 12 | 80 | 150 | 0 | 0.50 |" in text
    assert "| mix_saturated | none | 1600 | 80.0 | 12 | 80 | 150 | 0 | 0.40 |" in text
    assert "| mix_saturated: GET " in text  # its endpoints under it
    assert "| mix | 0.1-0.9 s | 105 | 50.0 | 12 | 80 | 150 | 0 | 0.25 |" in text
    assert "| reads >= 0.6x the floor's requests/s | 0.50 | NOT met |" in text
    assert "| whole mix without think time >= 0.35x the floor's requests/s | 0.40 | met |" in text
    assert "the mix with its think time, the latency a client sees: p95 80 ms" in text
    assert "caps it at 100 requests/s with 50 users, however fast the answers: 0.50 of" in text


def test_the_saturated_mix_is_in_the_json_with_its_own_figures() -> None:
    report = _with_phases(floor_rps=200.0, reads_rps=100.0, mix_rps=50.0, saturated_rps=80.0)

    written = json.loads(json.dumps(report, default=str))

    assert written["phases"]["mix_saturated"]["total"]["rps"] == 80.0
    row = next(r for r in written["capacity"]["phases"] if r["phase"] == "mix_saturated")
    assert (row["think_s"], row["of_floor"], row["server_errors"]) == ([0.0, 0.0], 0.4, 0)


def test_capacity_goals_not_met_do_not_fail_the_run() -> None:
    report = _with_phases(floor_rps=200.0, reads_rps=10.0, mix_rps=10.0)

    assert report["ok"]
    assert "| verdict | PASS |" in load.format_report(report)


def test_a_server_error_in_any_phase_before_the_mix_fails_the_run() -> None:
    report = _with_phases(floor_rps=200.0, reads_rps=130.0, mix_rps=50.0)
    report["phases"]["floor"]["statuses"]["GET /load floor"] = {"200": 10, "502": 2}
    report["phases"]["reads"]["unexpected"] = 1
    report["phases"]["mix_saturated"]["statuses"]["GET /runs"] = {"201": 10, "500": 1}
    report["phases"]["mix_saturated"]["replays"] = {"ok": 2, "wrong status": 1}

    assert load.problems(report) == [
        "floor: 2 answers with a 5xx status",
        "reads: 1 unexpected answers",
        "mix_saturated: 1 answers with a 5xx status",
        "mix_saturated: idempotent replays: {'ok': 2, 'wrong status': 1}",
    ]


def test_without_the_floor_the_report_says_the_phases_were_skipped() -> None:
    report = _report()
    report["capacity"] = load.capacity(report)

    assert report["capacity"] is None
    assert "the floor, the reads and the saturated mix were skipped (--floor-seconds 0)" in (
        load.format_report(report)
    )


def test_floor_seconds_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[load.Config] = []

    def fake_run_load(config: load.Config, directory: Path, log: Any) -> dict[str, Any]:
        seen.append(config)
        raise RuntimeError("stop here")

    monkeypatch.setenv("LOAD_FLOOR_SECONDS", "0")
    monkeypatch.setattr(load, "run_load", fake_run_load)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where main() makes its own

    assert load.main([]) == 1
    assert seen[0].floor_seconds == 0
    assert load.main(["--floor-seconds", "5"]) == 1
    assert seen[1].floor_seconds == 5


# --------------------------------------------------------------------------- the floor
def test_the_floor_is_routed_by_the_load_urlconf_and_not_by_the_public_one() -> None:
    from django.urls import resolve

    from api.errors import UNKNOWN_ROUTE
    from reliability.floor import FLOOR_NAME, FloorApi
    from reliability.load_mix import FLOOR

    assert resolve(FLOOR, urlconf="reliability.floor").func.view_class is FloorApi  # type: ignore[attr-defined]
    assert resolve(FLOOR, urlconf="reliability.floor").url_name == FLOOR_NAME
    assert resolve(FLOOR, urlconf="config.urls").url_name == UNKNOWN_ROUTE
    # Every public route stays as it was under the load URLconf.
    assert resolve("/api/v1/runs", urlconf="reliability.floor").url_name == "runs"


@pytest.mark.django_db
def test_the_public_api_answers_404_for_the_floor_even_with_a_key() -> None:
    from reliability.load_mix import FLOOR
    from tests.tenants import make_tenant

    answer = make_tenant().get(FLOOR)

    assert answer.status_code == 404
    assert answer.json()["code"] == "not_found"


@pytest.mark.django_db
def test_the_floor_reads_the_callers_organization_through_the_apis_authentication(
    settings: Any,
) -> None:
    from reliability.load_mix import FLOOR
    from tests.tenants import make_tenant

    settings.ROOT_URLCONF = "reliability.floor"
    tenant = make_tenant()

    answer = tenant.get(FLOOR)
    tenant.client.credentials()
    refused = tenant.get(FLOOR)

    assert answer.status_code == 200
    assert answer.json() == {"id": str(tenant.organization.pk), "name": tenant.organization.name}
    assert refused.status_code == 401
    assert refused.json()["code"] == "not_authenticated"


def test_the_load_settings_are_the_stacks_but_for_the_urlconf() -> None:
    import importlib

    from reliability.stack import SETTINGS_MODULE

    stack_settings = vars(importlib.import_module(SETTINGS_MODULE))
    load_settings = vars(importlib.import_module(load.LOAD_SETTINGS_MODULE))
    names = {name for name in {*stack_settings, *load_settings} if name.isupper()}

    differ = {n for n in names if stack_settings.get(n) is not load_settings.get(n)}

    assert differ == {"ROOT_URLCONF"}
    assert load_settings["ROOT_URLCONF"] == "reliability.floor"


def test_only_the_web_process_gets_the_load_settings(tmp_path: Path) -> None:
    from reliability.stack import SETTINGS_MODULE, Stack

    stack = Stack(tmp_path, web_settings_module=load.LOAD_SETTINGS_MODULE)

    assert stack.env["DJANGO_SETTINGS_MODULE"] == SETTINGS_MODULE
    assert stack.web_env["DJANGO_SETTINGS_MODULE"] == load.LOAD_SETTINGS_MODULE
    # Without it (make chaos), the web process has the stack's settings like the others.
    assert Stack(tmp_path).web_env == Stack(tmp_path).env
