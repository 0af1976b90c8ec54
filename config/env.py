"""Every environment variable the project reads, read and validated here.

Settings modules never touch ``os.environ`` directly: they ask an :class:`Env`, which
parses each value into its type and remembers what was wrong. ``Env.raise_if_invalid()``
then stops start-up with one message naming every missing or malformed variable, so a
misconfigured production deploy fails loudly instead of half-starting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from common.stores import without_password

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class _Missing:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Missing()


@dataclass
class Env:
    """Typed access to the environment that collects every problem before failing."""

    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    errors: list[str] = field(default_factory=list)
    # Names read, for the configuration table test and for `manage.py diffsettings`-like
    # introspection.
    read: dict[str, str] = field(default_factory=dict)

    def _raw(self, name: str, default: Any, help_text: str) -> str | None:
        self.read[name] = help_text
        value = self.environ.get(name)
        if value is None or value == "":
            if default is REQUIRED:
                self.errors.append(f"{name} is required but not set ({help_text})")
            return None
        return value

    def string(self, name: str, default: Any = REQUIRED, help_text: str = "") -> str:
        value = self._raw(name, default, help_text)
        if value is None:
            return "" if default is REQUIRED else str(default)
        return value

    def choice(self, name: str, default: str, choices: tuple[str, ...], help_text: str = "") -> str:
        value = self.string(name, default, f"{help_text} ({', '.join(choices)})")
        if value not in choices:
            self.errors.append(f"{name} must be one of {', '.join(choices)}, got {value!r}")
            return default
        return value

    def boolean(self, name: str, default: Any = REQUIRED, help_text: str = "") -> bool:
        value = self._raw(name, default, help_text)
        if value is None:
            return False if default is REQUIRED else bool(default)
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        self.errors.append(f"{name} must be a boolean (true/false), got {value!r}")
        return False

    def integer(
        self,
        name: str,
        default: Any = REQUIRED,
        help_text: str = "",
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int:
        value = self._raw(name, default, help_text)
        if value is None:
            return 0 if default is REQUIRED else int(default)
        try:
            number = int(value)
        except ValueError:
            self.errors.append(f"{name} must be an integer, got {value!r}")
            return 0 if default is REQUIRED else int(default)
        if minimum is not None and number < minimum:
            self.errors.append(f"{name} must be >= {minimum}, got {number}")
        if maximum is not None and number > maximum:
            self.errors.append(f"{name} must be <= {maximum}, got {number}")
        return number

    def number(self, name: str, default: Any = REQUIRED, help_text: str = "") -> float:
        value = self._raw(name, default, help_text)
        if value is None:
            return 0.0 if default is REQUIRED else float(default)
        try:
            return float(value)
        except ValueError:
            self.errors.append(f"{name} must be a number, got {value!r}")
            return 0.0 if default is REQUIRED else float(default)

    def strings(self, name: str, default: Any = REQUIRED, help_text: str = "") -> list[str]:
        value = self._raw(name, default, help_text)
        if value is None:
            return [] if default is REQUIRED else list(default)
        return [item.strip() for item in value.split(",") if item.strip()]

    def url(
        self,
        name: str,
        default: Any = REQUIRED,
        help_text: str = "",
        schemes: tuple[str, ...] = (),
    ) -> str:
        value = self.string(name, default, help_text)
        if not value:
            return value
        parts = urlsplit(value)
        if schemes and parts.scheme not in schemes:
            self.errors.append(
                f"{name} must be a URL with scheme {' or '.join(schemes)}, "
                f"got scheme {parts.scheme!r}"
            )
        elif not parts.hostname and not parts.path:
            self.errors.append(f"{name} must be a URL, got {without_password(value)!r}")
        return value

    def raise_if_invalid(self) -> None:
        if self.errors:
            # dict.fromkeys: a variable re-read by an override is reported once.
            lines = "\n  - ".join(dict.fromkeys(self.errors))
            raise ImproperlyConfigured(f"Invalid environment configuration:\n  - {lines}")
