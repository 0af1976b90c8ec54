"""The pure parts of `make chaos` and `make chaos-net` (no cluster, no root): the plans
the clients send, chaos-net's fault schedule, the effect endpoint's answer, and a
client failing over from a web host that refuses to the next."""

from __future__ import annotations

import itertools
import json
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from reliability.chaos_net import FAULT_KINDS, NetConfig, fault_schedule
from reliability.client import Client, Tally
from reliability.workload import EXPECTED, NET_KINDS, SLOW_EFFECT_S, EffectServer, plan_for
from runs.plan import parse_plan


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", NET_KINDS)
def test_every_plan_of_the_chaos_workloads_is_valid(kind: str, seed: int) -> None:
    parse_plan(plan_for(kind, seed, "http://198.18.0.1:9/effect", random.Random(seed)))
    assert kind in EXPECTED


def test_the_slow_effect_outlasts_a_partition_of_a_worker_host() -> None:
    # The fencing check needs the attempt run again elsewhere to be still running when
    # the cut-off worker comes back and tries to record.
    config = NetConfig()
    lease_and_sweep = 5 + 2
    assert lease_and_sweep < config.postgres_partition_s
    assert config.postgres_partition_s + lease_and_sweep < SLOW_EFFECT_S
    plan = plan_for("slow", 0, "http://198.18.0.1:9/effect", random.Random(0))
    slow = plan["agents"][0]["tasks"][0]["steps"][0]
    assert slow["params"]["json"]["hold"] == SLOW_EFFECT_S
    assert slow["params"]["timeout"] > SLOW_EFFECT_S


@pytest.mark.parametrize("seed", range(20))
def test_the_fault_schedule_has_every_kind_once_each_with_room_to_finish(seed: int) -> None:
    config = NetConfig(seed=seed)
    schedule = fault_schedule(config, random.Random(seed))

    assert sorted(f.kind for f in schedule) == sorted(FAULT_KINDS)
    times = [f.at_s for f in schedule]
    assert times == sorted(times)
    assert times[0] == config.first_fault_s
    # Each leaves at least the shortest fault's length and the smallest gap to the next.
    shortest = min(config.postgres_partition_s, config.host_down_s, config.web_cut_s)
    assert all(b - a >= shortest + config.gap_s[0] - 0.01 for a, b in itertools.pairwise(times))
    # The schedule fits the window the runs are submitted over.
    assert times[-1] < config.window_s


def test_the_fault_schedule_is_the_seeds() -> None:
    def kinds(seed: int) -> list[str]:
        return [f.kind for f in fault_schedule(NetConfig(seed=seed), random.Random(seed))]

    assert kinds(7) == kinds(7)
    assert len({tuple(kinds(seed)) for seed in range(10)}) > 1


def test_the_effect_endpoint_records_then_answers_with_the_attempt_it_saw() -> None:
    server = EffectServer()
    try:
        answer = httpx.post(server.url, json={"step": 12, "attempt": 3, "hold": 0.05})
        assert answer.status_code == 200
        assert answer.json() == {"ok": True, "step": 12, "attempt": 3}
        assert server.log.snapshot() == {(12, 3): 1}
        assert httpx.post(server.url, json={"step": "x"}).status_code == 400
    finally:
        server.close()


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        payload = json.dumps({"host": "live"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_a_client_fails_over_to_the_next_web_host_when_one_refuses() -> None:
    live = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    with socket.socket() as closed:  # a loopback port nobody listens on: refused at once
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    dead, alive = f"http://127.0.0.1:{dead_port}", f"http://127.0.0.1:{live.server_port}"
    tally = Tally()
    client = Client(dead, "key", tally, deadline_s=10, fallbacks=[dead, alive])
    try:
        assert client.request("GET", "/").json() == {"host": "live"}
        assert client.request("GET", "/").json() == {"host": "live"}  # and stays there
    finally:
        client.close()
        live.shutdown()
        live.server_close()
    assert tally.connection_errors == 1
    assert tally.statuses == {200: 2}
