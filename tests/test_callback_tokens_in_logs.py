"""A callback URL's token (a credential: it ends the step) in no log line: gunicorn's
access log (``config.access_log``, named by config/gunicorn.py as the Procfile loads it)
and the application's log lines (``config.logging.RedactSecrets``: Django logs the path
of every 4xx answer) show the callback's id and ``[redacted]`` in its place."""

from __future__ import annotations

import logging
import runpy
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from gunicorn.config import Config

from common.redaction import REDACTED, without_callback_tokens
from config.access_log import AccessLogger
from config.logging import RedactSecrets

ID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
SECRET = "Zx9-Yw8_Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa987"
TOKEN = f"{ID}.{SECRET}"
SHOWN = f"/api/v1/callbacks/{ID}.{REDACTED}"
SETTINGS = Path(__file__).resolve().parent.parent / "config" / "gunicorn.py"


def test_gunicorns_access_log_shows_a_callbacks_id_never_its_token(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    cfg = Config()
    cfg.set("logger_class", runpy.run_path(str(SETTINGS))["logger_class"])
    cfg.set("accesslog", str(log))
    # The default format, and every other field a path or a URL can reach.
    cfg.set(
        "access_log_format",
        '%(h)s "%(r)s" %(s)s "%(f)s" %(U)s?%(q)s %({raw_uri}e)s %({x-callback}i)s',
    )
    logger = cfg.logger_class(cfg)
    assert isinstance(logger, AccessLogger)
    path = f"/api/v1/callbacks/{TOKEN}"
    environ = {
        "REQUEST_METHOD": "POST",
        "RAW_URI": f"{path}?via=ci",
        "PATH_INFO": path,
        "QUERY_STRING": f"next=https://example.invalid{path}",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_REFERER": f"https://ci.example{path}",
    }
    request = SimpleNamespace(headers=[("X-CALLBACK", f"http://127.0.0.1:8000{path}")])
    response = SimpleNamespace(status="200 OK", sent=11, headers=[])

    logger.access(response, request, environ, timedelta(milliseconds=3))
    for handler in logger.access_log.handlers:
        handler.flush()

    line = log.read_text()
    assert SECRET not in line
    assert line.count(SHOWN) == 6, line
    assert f'"POST {SHOWN}?via=ci HTTP/1.1" 200' in line


def test_an_application_log_line_shows_a_callbacks_id_never_its_token() -> None:
    # What Django's django.request logger writes for a 400 on a callback still open.
    record = logging.LogRecord(
        "django.request",
        logging.WARNING,
        __file__,
        1,
        "%s: %s",
        ("Bad Request", f"/api/v1/callbacks/{TOKEN}"),
        None,
    )

    assert RedactSecrets().filter(record)

    assert record.getMessage() == f"Bad Request: {SHOWN}"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"GET /api/v1/callbacks/{TOKEN} HTTP/1.1", f"GET {SHOWN} HTTP/1.1"),
        (f"/api/v1/callbacks/{TOKEN}/", f"{SHOWN}/"),
        (f"'/api/v1/callbacks/{TOKEN}'", f"'{SHOWN}'"),
        (f"/api/v1/callbacks/{ID}", f"/api/v1/callbacks/{ID}"),  # an id alone is no secret
        (f"/api/v1/callbacks/{ID}%2E{SECRET}", SHOWN),
        (f"/api/v1/callbacks/{SECRET}?x=1", f"/api/v1/callbacks/{REDACTED}?x=1"),
        ("/api/v1/callbacks/", "/api/v1/callbacks/"),
        ("/api/v1/runs/x", "/api/v1/runs/x"),
    ],
)
def test_without_callback_tokens_keeps_the_id_and_hides_the_rest(text: str, shown: str) -> None:
    assert without_callback_tokens(text) == shown
