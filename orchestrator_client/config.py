"""Where ``orch login`` keeps the server's URL and the API key, and how they are read back.

The file is JSON, ``{"url": ..., "api_key": ...}``, at ``$ORCH_CONFIG`` when set, else
``$XDG_CONFIG_HOME/orch/config.json`` (``~/.config/orch/config.json`` without it). It holds
a credential, so it is written with mode 600 in a directory of mode 700, through a
temporary file renamed over the old one: a reader never sees half a file, and the key is
never readable by others, not even for a moment.

``ORCH_URL`` and ``ORCH_API_KEY`` override what the file says, each on its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

CONFIG_ENV = "ORCH_CONFIG"
URL_ENV = "ORCH_URL"
API_KEY_ENV = "ORCH_API_KEY"


class ConfigError(Exception):
    """The configuration is missing, unreadable or incomplete."""


@dataclass(frozen=True)
class Config:
    url: str
    api_key: str


def config_path() -> Path:
    """The config file's path (it may not exist yet)."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "orch" / "config.json"


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object")
    return {key: value for key, value in data.items() if isinstance(value, str)}


def load() -> Config:
    """The URL and key to use: the environment's, else the config file's."""
    path = config_path()
    stored = _read(path)
    url = os.environ.get(URL_ENV) or stored.get("url", "")
    api_key = os.environ.get(API_KEY_ENV) or stored.get("api_key", "")
    if not url or not api_key:
        missing = " and no ".join(
            name for name, value in (("URL", url), ("API key", api_key)) if not value
        )
        raise ConfigError(
            f"no {missing} configured: run `orch login --url URL --api-key KEY` "
            f"(or set {URL_ENV} and {API_KEY_ENV}); looked in {path}"
        )
    return Config(url=url, api_key=api_key)


def save(config: Config) -> Path:
    """Write the config file (mode 600, its directory 700); return its path."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = json.dumps({"url": config.url, "api_key": config.api_key}, indent=2) + "\n"
    # mkstemp creates the file with mode 600 already: the key is never world-readable.
    fd, temporary = tempfile.mkstemp(prefix=".config-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return path
