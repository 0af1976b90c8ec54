"""The ``orch`` command itself: its root (``--version``), ``login``, ``balance``,
``ledger`` and ``worker``, and its groups ``runs``, ``jobs`` and ``schedules``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from orchestrator_client import config
from orchestrator_client._version import __version__
from orchestrator_client.cli import jobs, runs, schedules
from orchestrator_client.cli.base import (
    EXIT_OK,
    MARKUP,
    JsonOption,
    LimitOption,
    Output,
    amount,
    client,
    guarded,
    page_for,
    table_of,
    when,
)
from orchestrator_client.client import Client, api_root

app = typer.Typer(
    name="orch",
    help="The run orchestrator's command line: submit, watch and steer runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=MARKUP,
)
app.add_typer(runs.app, name="runs")
app.add_typer(jobs.app, name="jobs")
app.add_typer(schedules.app, name="schedules")


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"orch {__version__}\n")
        raise typer.Exit(EXIT_OK)


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Set the server with `orch login` (or ORCH_URL and ORCH_API_KEY), then use `orch runs`."""


@app.command()
@guarded
def login(
    url: Annotated[str, typer.Option("--url", prompt="Server URL", help="The server's root URL.")],
    api_key: Annotated[
        str,
        typer.Option("--api-key", prompt="API key", hide_input=True, help="An API key (ork_...)."),
    ],
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Check the key with the server first.")
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Keep the server's URL and an API key in your config directory (mode 600)."""
    out = Output(as_json)
    try:
        settings = config.Config(url=api_root(url), api_key=api_key.strip())
    except ValueError as exc:
        raise config.ConfigError(str(exc)) from exc
    organization = None
    if verify:
        with Client(settings.url, settings.api_key) as api:
            organization = api.organization()
    path = config.save(settings)
    if as_json:
        out.json({"url": settings.url, "config": str(path), "organization": organization})
        return
    who = f" as organization {organization['name']}" if organization else ""
    out.line(f"logged in to {settings.url}{who}; saved to {path}")


@app.command()
@guarded
def balance(as_json: JsonOption = False) -> None:
    """Your credits: available, reserved (held by runs in progress), spent, total."""
    out = Output(as_json)
    with client() as api:
        amounts = api.balance()
    if as_json:
        out.json(amounts)
        return
    table = table_of("AVAILABLE", "RESERVED", "SPENT", "TOTAL")
    table.add_row(
        amount(amounts["available"]),
        amount(amounts["reserved"]),
        amount(amounts["spent"]),
        amount(amounts["total"]),
    )
    out.console.print(table)


@app.command()
@guarded
def ledger(
    type: Annotated[
        str | None, typer.Option("--type", help="grant, reserve, charge or refund.")
    ] = None,
    run: Annotated[str | None, typer.Option("--run", help="One run's entries.")] = None,
    limit: LimitOption = 20,
    as_json: JsonOption = False,
) -> None:
    """Every movement of your credits, newest first."""
    out = Output(as_json)
    with client() as api:
        entries = list(
            api.ledger(type=type, run=run, page_size=page_for(limit), limit=limit or None)
        )
    if as_json:
        out.json(entries)
        return
    table = table_of("CREATED (UTC)", "TYPE", "AMOUNT", "RUN", "REASON")
    for entry in entries:
        table.add_row(
            when(entry["created_at"], labelled=False),
            entry["type"],
            amount(entry["amount"]),
            entry["run"] or "",
            escape(entry["reason"]),
        )
    out.console.print(table) if entries else out.line("no entries")


@app.command()
@guarded
def worker(
    modules: Annotated[
        list[str],
        typer.Argument(
            help="Where the @tool functions are: modules (pkg.tools) or attributes "
            "(pkg.tools:summarize).",
            show_default=False,
        ),
    ],
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Jobs at once.")] = 8,
    tags: Annotated[
        str, typer.Option("--tags", help="Labels steps may demand, comma separated.")
    ] = "",
    hostname: Annotated[
        str | None, typer.Option("--hostname", help="Its name (default: this host's).")
    ] = None,
    project_dir: Annotated[
        str | None,
        typer.Option("--project-dir", help="With the hostname, its identity (default: cwd)."),
    ] = None,
    grace_period: Annotated[
        float,
        typer.Option("--grace-period", min=0, help="Seconds a stopped tool has to end."),
    ] = 5.0,
) -> None:
    """Serve your @tool functions from this host (docs/tools.md): register as a runner
    offering them, run their steps, until SIGINT or SIGTERM."""
    from orchestrator_client.worker import serve  # imports the tools' modules

    serve(
        modules,
        concurrency=concurrency,
        tags=[tag.strip() for tag in tags.split(",") if tag.strip()],
        hostname=hostname,
        project_dir=project_dir,
        grace_period=grace_period,
    )


def main() -> None:
    """The console script ``orch``."""
    app()
