"""``orch``: the orchestrator from a terminal or a script (docs/cli.md).

    orch login --url http://127.0.0.1:8000 --api-key ork_...
    orch runs submit plan.yaml --watch
    orch runs ls --status failed
    orch runs events RUN --follow
    orch balance --json

Exit codes: 0 success (a watched run completed); 1 the API refused (the error's code and
message are printed), the server could not be reached, or a watched run failed or was
cancelled; 2 a usage error (an unknown command or option, a missing or unreadable plan
file, no URL or API key configured). ``--json`` on every command prints JSON on stdout
(one document; ``events --follow`` prints one event per line) and errors as
``{"error": {status, code, message, details}}``.
"""

from __future__ import annotations

from orchestrator_client.cli.root import app, main

__all__ = ["app", "main"]
