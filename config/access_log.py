"""gunicorn's access log (``accesslog`` in ``config/gunicorn.py``) without callback tokens.

A callback step's URL, ``/api/v1/callbacks/<id>.<secret>``, is a credential: whoever
holds it ends the step. Every field a line may show (the request line, the path, the
referer, headers, environ) is written with the token replaced
(``common.redaction.without_callback_tokens``): the callback's id stays, to tell lines
apart. ``config/gunicorn.py`` names this class as gunicorn's ``logger_class``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gunicorn.glogging import Logger

from common.redaction import CALLBACK_PATH, without_callback_tokens


class AccessLogger(Logger):  # type: ignore[misc]  # gunicorn ships no type hints
    def atoms(
        self, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta
    ) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        return {
            key: without_callback_tokens(value)
            if isinstance(value, str) and CALLBACK_PATH in value
            else value
            for key, value in atoms.items()
        }
