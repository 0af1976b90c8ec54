"""The decorated no-op tool `make bench`'s fan_2000_tool scenario runs on the fleet: the
bench's Celery worker imports this module (``--include``), which registers it as
``orchestrator.tools.packages.load`` registers an entry point's tools, so that its steps
take the path of a package's tool (the catalogue's check at submission, the context,
the outcome's classification) beside the built-in ``noop`` of fan_2000."""

from __future__ import annotations

from orchestrator.tools import packages
from orchestrator_client.tools import tool

from .plans import FLEET_NOOP


@tool(name=FLEET_NOOP, version="1")
def fleet_noop() -> None:
    """Do nothing: a step's cost is the engine's and the decorator's alone."""


packages.register([fleet_noop], source=__name__)
