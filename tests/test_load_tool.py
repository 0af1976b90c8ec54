"""The pure parts of `make load`: the request mix, the tally and the report (no servers,
no locust: ``reliability.load_users`` is never imported here, since importing locust
monkey-patches the standard library with gevent)."""

from __future__ import annotations

import json
import random
import re
import sys
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
