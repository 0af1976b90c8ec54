#!/usr/bin/env bash
# `make run`: local PostgreSQL and Redis (unless DATABASE_URL / CELERY_BROKER_URL are set),
# migrations, an admin user, then web, worker, webhooks, beat and Flower under honcho.
# Ctrl-C stops every process this script started and exits 0.
set -euo pipefail

DEFAULT_DATABASE_URL=postgres://orchestrator@127.0.0.1:55432/orchestrator
DEFAULT_BROKER_URL=redis://127.0.0.1:56379/0
DEFAULT_SETTINGS=config.settings.local

# scheme://user:secret@host... -> scheme://user:***@host... (each of a ';'-separated list,
# as sentinel:// URLs are); a URL without a password is shown as it is, pasteable.
mask_password() {
  local part parts masked=()
  IFS=';' read -ra parts <<< "$1"
  for part in "${parts[@]}"; do
    if [[ $part =~ ^([A-Za-z][A-Za-z0-9+.-]*://[^:@/]*):[^@/]*@(.*)$ ]]; then
      part="${BASH_REMATCH[1]}:***@${BASH_REMATCH[2]}"
    fi
    masked+=("$part")
  done
  local IFS=';'
  echo "${masked[*]}"
}

# Sourced (tests/integration/test_make_run.py), only the functions above are wanted.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0

cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-$DEFAULT_SETTINGS}
export WEB_PORT=${WEB_PORT:-8000}
export FLOWER_PORT=${FLOWER_PORT:-5555}
# One gevent worker serves a developer (its requests run as greenlets, thousands at once);
# each one more loads Django again at every start. Production's default is 2.
export WEB_CONCURRENCY=${WEB_CONCURRENCY:-1}
# Locally the four processes log readable text at WARNING, so that the demo's progress
# and the summary are not lost between them; JSON at INFO stays the production default.
# LOG_FORMAT=json LOG_LEVEL=INFO make run shows what production logs.
export LOG_FORMAT=${LOG_FORMAT:-text}
export LOG_LEVEL=${LOG_LEVEL:-WARNING}
# As root (a container, a VM of one's own), the stack runs as root on purpose: a developer's
# machine, PostgreSQL already run as its own account, and no pickle accepted (Celery
# refuses root with it). Celery's warning about a worker as root, at each start of each
# worker, is silenced; every other warning stays.
if [ "$(id -u)" = 0 ]; then
  export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:You're running the worker with superuser privileges"
fi
DATA=${DATA_DIR:-.data}
mkdir -p "$DATA"
chmod 755 "$DATA"

started_services=0
honcho_pid=""
cleanup() {
  local status=$?
  trap - EXIT INT TERM HUP
  # 130: a command of ours died of the Ctrl-C, and `set -e` ended the script on it
  # before the INT trap below could: the same clean stop.
  [ "$status" != 130 ] || status=0
  if [ -n "$honcho_pid" ] && kill -0 "$honcho_pid" 2>/dev/null; then
    kill -TERM "$honcho_pid" 2>/dev/null || true
    wait "$honcho_pid" 2>/dev/null || true
  fi
  if [ "$started_services" = 1 ]; then
    echo "==> stopping local PostgreSQL and Redis"
    python scripts/local_servers.py stop --dir "$DATA"
  fi
  exit "$status"
}
trap cleanup EXIT
# Ctrl-C is how a developer stops the stack: a clean stop, status 0. (make itself must
# not see it: the Makefile runs this script as a job of its own in the terminal.)
trap 'exit 0' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Another program on these ports (another make run?) would answer in our stead. Checked
# first: a second make run of this checkout must not stop the servers the first uses.
for port in "$WEB_PORT" "$FLOWER_PORT"; do
  if (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "127.0.0.1:$port is taken by another program (WEB_PORT and FLOWER_PORT choose others)" >&2
    exit 1
  fi
done

service_args=()
[ -n "${DATABASE_URL:-}" ] && service_args+=(--no-postgres)
[ -n "${CELERY_BROKER_URL:-}" ] && service_args+=(--no-redis)
if [ ${#service_args[@]} -lt 2 ]; then
  echo "==> starting local servers in $DATA"
  # A server that does not start: local_servers.py says which and where its log is, in one
  # line; nothing after it could work. (The assignment, not `eval "$(...)"`, keeps its
  # exit status.)
  exports=$(python scripts/local_servers.py start --dir "$DATA" \
    --pg-port "${DEV_PG_PORT:-55432}" --redis-port "${DEV_REDIS_PORT:-56379}" --redis-aof \
    "${service_args[@]}") || { python scripts/local_servers.py stop --dir "$DATA"; exit 1; }
  started_services=1
  eval "$exports"
  export DATABASE_URL CELERY_BROKER_URL
fi

# The admin password and the metrics token are generated once and kept in $DATA.
admin_password_file="$DATA/admin-password"
# Letters and digits only: pasted from the banner into a command line, a password that
# begins with `-` reads as an option (`prepare` itself passes any as `--password=VALUE`).
[ -s "$admin_password_file" ] || python -c "import secrets, string
print(''.join(secrets.choice(string.ascii_letters + string.digits) for _ in range(16)))" \
  > "$admin_password_file"
metrics_token_file="$DATA/metrics-token"
[ -s "$metrics_token_file" ] || python -c "import secrets; print(secrets.token_urlsafe(24))" > "$metrics_token_file"
# /metrics answers only to this bearer token.
export METRICS_TOKEN=${METRICS_TOKEN:-$(cat "$metrics_token_file")}

echo "==> migrating, static files, periodic tasks, admin user"
python manage.py prepare --admin-username admin --admin-password-file "$admin_password_file"

echo "==> starting web, worker, webhooks, beat and flower"
honcho start -f Procfile &
honcho_pid=$!

site="http://127.0.0.1:$WEB_PORT"
python scripts/local_servers.py wait-healthy --url "$site/healthz" --timeout 60 --pid "$honcho_pid"
demo_line="(SKIP_DEMO=1: none)"
if [ "${SKIP_DEMO:-0}" != 1 ]; then
  echo "==> demo run"
  rm -f "$DATA/demo-run-id"
  python manage.py demo_run --id-file "$DATA/demo-run-id" \
    || echo "!! the demo run did not complete: see the worker's log above"
  if [ -s "$DATA/demo-run-id" ]; then
    demo_line="$site/admin/runs/run/$(cat "$DATA/demo-run-id")/change/"
  else
    demo_line="(not submitted: see above)"
  fi
fi

# A second terminal reaches the web at $URL (the README's commands use it); manage.py
# there reaches this stack's servers with its defaults, other servers or settings need
# these exported first.
second_terminal="    export URL=$site"
if [ "$DATABASE_URL" != "$DEFAULT_DATABASE_URL" ] \
  || [ "$CELERY_BROKER_URL" != "$DEFAULT_BROKER_URL" ] \
  || [ "$DJANGO_SETTINGS_MODULE" != "$DEFAULT_SETTINGS" ]; then
  second_terminal+="
    export DATABASE_URL=$(mask_password "$DATABASE_URL")
    export CELERY_BROKER_URL=$(mask_password "$CELERY_BROKER_URL")
    export DJANGO_SETTINGS_MODULE=$DJANGO_SETTINGS_MODULE"
  if [ "$(mask_password "$DATABASE_URL")" != "$DATABASE_URL" ] \
    || [ "$(mask_password "$CELERY_BROKER_URL")" != "$CELERY_BROKER_URL" ]; then
    second_terminal+=$'\n'"    (*** stands for the password you set)"
  fi
fi

rule="================================================================================"
cat <<INFO

$rule
  Orchestrator is up.
    Admin           $site/admin/   (admin / $(cat "$admin_password_file"))
    Demo run        $demo_line
    Dashboard       $site/admin/dashboard/  (each run's page is live)
    API             $site/api/v1/  (docs: $site/api/docs/, $site/api/redoc/)
    Health          $site/healthz
    Metrics         $site/metrics  (Authorization: Bearer \$METRICS_TOKEN)
    METRICS_TOKEN=$METRICS_TOKEN
    Flower          http://127.0.0.1:$FLOWER_PORT/  (FLOWER_BASIC_AUTH, default admin:admin)
    PostgreSQL      $(mask_password "$DATABASE_URL")
    Redis broker    $(mask_password "$CELERY_BROKER_URL")

  In another terminal, from this folder:
$second_terminal
    $VENV/bin/python manage.py create_org NAME       (prints an API key, once)
    $VENV/bin/orch login --url \$URL --api-key KEY    (then: $VENV/bin/orch --help; docs/cli.md)
    source $VENV/bin/activate                         (puts orch and python on PATH, as orch's hints write them)

  Logs below: text at $LOG_LEVEL (LOG_LEVEL=INFO for more). Press Ctrl-C to stop everything.
$rule

INFO
wait "$honcho_pid"
