"""The reference runner's arguments, read before it registers: the server's URL is taken
as the client takes it (with or without ``/api/v1``), and one it could never reach is
refused at once. Its jobs against a live server: tests/integration/test_runners.py."""

from __future__ import annotations

import pytest

from orchestrator_client.runner import Runner, parse_args

ARGS = ["--api-key", "k", "--command", "true"]


def runner_for(url: str) -> Runner:
    args = parse_args(["--url", url, *ARGS])
    return Runner(
        url=args.url,
        api_key=args.api_key,
        command=["true"],
        hostname="h",
        project_dir="",
        executor_type="command",
    )


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "http://127.0.0.1:1/api/v1/"])
def test_the_runner_takes_the_servers_url_with_or_without_the_api_prefix(url: str) -> None:
    runner = runner_for(url)
    assert runner.url == "http://127.0.0.1:1"  # what its commands get as ORCH_URL
    assert str(runner.client.base_url) == "http://127.0.0.1:1/api/v1/"


def test_the_runner_refuses_a_url_without_http_before_it_registers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--url", "127.0.0.1:8000", *ARGS])
    assert exited.value.code == 2
    assert "the URL must start with http:// or https://" in capsys.readouterr().err
