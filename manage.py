#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import gc
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
    # The process ends here. Python's last collections would walk every object Django
    # loaded, a second on 2 cores (`make run` waits on it), to free memory the exit frees.
    gc.freeze()


if __name__ == "__main__":
    main()
