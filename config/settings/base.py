"""Settings shared by every environment, one module per concern.

Every value that can vary between deployments comes from the environment through
``config.env.Env`` (one, ``config.settings.environment.env``); the thin ``local``, ``test``
and ``production`` modules only change defaults and make the production essentials
mandatory. docs/configuration.md lists each variable read, in sections named as these
modules.
"""

from __future__ import annotations

import django_stubs_ext

from config.settings.api import *  # noqa: F403
from config.settings.artifacts import *  # noqa: F403
from config.settings.billing import *  # noqa: F403
from config.settings.broker import *  # noqa: F403
from config.settings.core import *  # noqa: F403
from config.settings.database import *  # noqa: F403
from config.settings.engine import *  # noqa: F403
from config.settings.escalation import *  # noqa: F403
from config.settings.operations import *  # noqa: F403
from config.settings.plans import *  # noqa: F403
from config.settings.quotas import *  # noqa: F403
from config.settings.schedules import *  # noqa: F403
from config.settings.tools import *  # noqa: F403
from config.settings.webhooks import *  # noqa: F403

# Lets classes such as admin.ModelAdmin[Run] be subscripted at run time, as typed.
django_stubs_ext.monkeypatch()
