#!/usr/bin/env bash
# `make run`: local PostgreSQL and Redis (unless DATABASE_URL / CELERY_BROKER_URL are set),
# migrations, an admin user, then web, worker, beat and Flower under honcho. Ctrl-C stops
# every process this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-config.settings.local}
export WEB_PORT=${WEB_PORT:-8000}
export FLOWER_PORT=${FLOWER_PORT:-5555}
# Locally the four processes log readable text at WARNING, so that the demo's progress
# and the summary are not lost between them; JSON at INFO stays the production default.
# LOG_FORMAT=json LOG_LEVEL=INFO make run shows what production logs.
export LOG_FORMAT=${LOG_FORMAT:-text}
export LOG_LEVEL=${LOG_LEVEL:-WARNING}
DATA=${DATA_DIR:-.data}
mkdir -p "$DATA"
chmod 755 "$DATA"

started_services=0
honcho_pid=""
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$honcho_pid" ] && kill -0 "$honcho_pid" 2>/dev/null; then
    kill -TERM "$honcho_pid" 2>/dev/null || true
    wait "$honcho_pid" 2>/dev/null || true
  fi
  if [ "$started_services" = 1 ]; then
    echo "==> stopping local PostgreSQL and Redis"
    python scripts/services.py stop --dir "$DATA"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

service_args=()
[ -n "${DATABASE_URL:-}" ] && service_args+=(--no-postgres)
[ -n "${CELERY_BROKER_URL:-}" ] && service_args+=(--no-redis)
if [ ${#service_args[@]} -lt 2 ]; then
  echo "==> starting local servers in $DATA"
  started_services=1
  eval "$(python scripts/services.py start --dir "$DATA" \
    --pg-port "${DEV_PG_PORT:-55432}" --redis-port "${DEV_REDIS_PORT:-56379}" --redis-aof "${service_args[@]}")"
  export DATABASE_URL CELERY_BROKER_URL
fi

echo "==> migrating"
python manage.py migrate --noinput -v 0
python manage.py collectstatic --noinput -v 0
python manage.py setup_periodic_tasks

admin_password_file="$DATA/admin-password"
[ -s "$admin_password_file" ] || python -c "import secrets; print(secrets.token_urlsafe(12))" > "$admin_password_file"
python manage.py ensure_admin --username admin --password="$(cat "$admin_password_file")"
# /metrics answers only to this bearer token (kept, like the admin password).
metrics_token_file="$DATA/metrics-token"
[ -s "$metrics_token_file" ] || python -c "import secrets; print(secrets.token_urlsafe(24))" > "$metrics_token_file"
export METRICS_TOKEN=${METRICS_TOKEN:-$(cat "$metrics_token_file")}

echo "==> starting web, worker, beat and flower"
honcho start -f Procfile &
honcho_pid=$!

python manage.py wait_healthy --url "http://127.0.0.1:$WEB_PORT/healthz" --timeout 60
if [ "${SKIP_DEMO:-0}" != 1 ]; then
  echo "==> demo run"

  python manage.py demo_run || echo "!! the demo run did not complete: see the worker's log above"
fi

rule="================================================================================"
cat <<INFO

$rule
  Orchestrator is up.
    Admin           http://127.0.0.1:$WEB_PORT/admin/   (admin / $(cat "$admin_password_file"))
    Dashboard       http://127.0.0.1:$WEB_PORT/admin/dashboard/  (each run's page is live)
    API             http://127.0.0.1:$WEB_PORT/api/v1/  (docs: /api/docs/, /api/redoc/)
    Health          http://127.0.0.1:$WEB_PORT/healthz
    Metrics         http://127.0.0.1:$WEB_PORT/metrics  (Authorization: Bearer \$METRICS_TOKEN)
    METRICS_TOKEN=$METRICS_TOKEN
    Flower          http://127.0.0.1:$FLOWER_PORT/      (FLOWER_BASIC_AUTH, default admin:admin)
    CLI             $VENV/bin/orch login --url http://127.0.0.1:$WEB_PORT --api-key KEY
                    (a key: python manage.py create_org NAME; docs/cli.md)
    PostgreSQL      ${DATABASE_URL//:*@/:***@}
    Redis broker    ${CELERY_BROKER_URL//:*@/:***@}
  Logs below: text at $LOG_LEVEL (LOG_LEVEL=INFO for more). Press Ctrl-C to stop everything.
$rule

INFO
wait "$honcho_pid"
