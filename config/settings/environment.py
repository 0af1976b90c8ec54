"""The one reader of the environment that every settings module shares (``config.env.Env``:
what was read, and every problem, collected for ``raise_if_invalid``), and the checkout's
root."""

from __future__ import annotations

from pathlib import Path

from config.env import Env

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = Env()
