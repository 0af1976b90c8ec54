import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
application = get_wsgi_application()

# Traces (config.otel): in each gunicorn worker, which loads this module after its fork.
from config import otel  # noqa: E402

otel.setup_from_settings("web")
