"""The settings of `make load`'s web process: the stack's own (``reliability.stack.
SETTINGS_MODULE``), with the floor's URLconf (``reliability.floor``) as the root.

Nothing else differs, so that the floor, the reads and the mix are measured on the same
server as a deployment's. The Celery workers, beat and the harness keep the stack's
settings; only ``Stack(web_settings_module=...)`` selects this module.
"""

from config.settings.local import *  # noqa: F403

ROOT_URLCONF = "reliability.floor"
