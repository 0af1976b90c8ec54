"""`python -m config.flower`: start Flower, refusing to start it without authentication.

Credentials come from FLOWER_BASIC_AUTH through the settings (validated there), and are
handed to Flower through its own environment variable rather than the command line, where
`ps` would show them.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
    # The settings only (validated as they load), not django.setup(): the apps would be
    # loaded again by Flower after the exec, and loading them costs seconds at start-up.
    from django.conf import settings

    if not settings.FLOWER_BASIC_AUTH:
        sys.exit("FLOWER_BASIC_AUTH is not set: Flower does not run without authentication.")
    os.environ["FLOWER_BASIC_AUTH"] = settings.FLOWER_BASIC_AUTH
    os.execvp(  # noqa: S606 - replace this process: signals reach Flower directly
        sys.executable,
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "flower",
            f"--port={settings.FLOWER_PORT}",
            f"--address={settings.FLOWER_ADDRESS}",
            *sys.argv[1:],
        ],
    )


if __name__ == "__main__":
    main()
