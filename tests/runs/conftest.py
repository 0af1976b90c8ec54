"""Fixtures shared by the tests of the runs app."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.transport import CeleryTransport
from runs.outbox import use_transport
from tests.runs.engine.harness import RecordingTransport


@pytest.fixture
def transport(settings: Any) -> Iterator[RecordingTransport]:
    """Messages kept instead of published (the Celery transport restored after)."""
    settings.ORCHESTRATOR_DISPATCH_ENABLED = True
    recording = RecordingTransport()
    use_transport(recording)
    try:
        yield recording
    finally:
        use_transport(CeleryTransport())
