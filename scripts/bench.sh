#!/usr/bin/env bash
# `make bench`: the engine against raw Celery on throwaway PostgreSQL and Redis (free
# loopback ports, a temporary directory), one worker process for both. Not part of
# `make test`: it reports figures, it asserts none. The servers, the worker and the
# directory (with the worker log) are removed on exit, whatever happens; BENCH_KEEP=1
# keeps the directory.
#
#   BENCH_WORKERS=2   worker children (prefork)
#   BENCH_REPEAT=1    passes over every scenario; medians are reported
#   BENCH_CLIENTS=8   client processes that submit the many-runs scenarios side by
#                     side (many_runs, many_runs_orgs, many_runs_api, many_chains)
#   BENCH_TIMEOUT=600 seconds each scenario may take
#   BENCH_JSON=path   also write every figure and goal verdict there as JSON
#   BENCH_NO_ANALYZE=1 no ANALYZE before each scenario (statistics as fresh as a new
#                     database's: see bench.run.analyze)
#   BENCH_TRACING=1   traces on: OpenTelemetry exported over OTLP/HTTP to a local
#                     collector that accepts and discards (bench/collector.py)
#   BENCH_PGBOUNCER=N run everything through PgBouncer in transaction mode with N
#                     server connections (installed from Debian when missing; its
#                     1.18 keeps no prepared statements, so they are turned off)
#
#   BENCH_WIDE_WORKERS=32 children of the worker the wide scenarios run on (fan_sleep,
#                     group_sleep, fan_2000_wide, group_2000_wide)
#
# Extra arguments go to `python -m bench.run` (e.g. --only seq_100,chain_100);
# `scripts/bench.sh profile [--steps N]` (`make profile`) runs `python -m bench.profile`
# instead: one step's cost in the engine, in process, under cProfile.
# `scripts/bench.sh profile-api [--requests N]` (`make profile-api`) runs `python -m
# bench.profile_api`: the API's routes through Django's WSGI handler in process, the time
# per request split by layer (authentication, throttle, idempotency, ..., middleware).
# `scripts/bench.sh scale [--json path]` runs `python -m bench.scale`: one run over fleets
# of several sizes, each worker a `celery worker` process of its own hostname
# (SCALE_SET="1x4 2x4 4x4 8x4 12x4", processes x children; SCALE_JSON=path).
# `scripts/bench.sh capacity [--json path]` (`make capacity`) runs `python -m
# bench.capacity`: what a step and a small run cost PostgreSQL (statements, rows, WAL,
# CPU), on a server with pg_stat_statements loaded and durability on (docs/capacity.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/orchestrator-bench.XXXXXX")
chmod 755 "$tmp"
cleanup() {
  python scripts/local_servers.py stop --dir "$tmp" || true
  if [ "${BENCH_KEEP:-}" = 1 ]; then
    echo "kept $tmp" >&2
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bouncer=()
if [ -n "${BENCH_PGBOUNCER:-}" ]; then
  if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    echo "==> installing pgbouncer" >&2
    (apt-get update -qq && apt-get install -y -qq pgbouncer) >/dev/null
  fi
  bouncer=(--pgbouncer "$BENCH_PGBOUNCER")
  # PgBouncer before 1.21 cannot follow a prepared statement from one transaction's
  # server connection to the next one's.
  if ! pgbouncer --version 2>/dev/null | grep -qE 'PgBouncer 1\.(2[1-9]|[3-9][0-9])'; then
    export DATABASE_PREPARED_STATEMENTS=false
  fi
fi
server=(--fast)
if [ "${1:-}" = capacity ]; then
  # Its statements counted, and what a production server writes and flushes: WAL with
  # full pages, a flush at each commit.
  server+=(--pg-option shared_preload_libraries=pg_stat_statements --pg-option fsync=on
    --pg-option synchronous_commit=on --pg-option full_page_writes=on)
fi
# A server that does not start: local_servers.py's one line, and nothing after it.
exports=$(python scripts/local_servers.py start --dir "$tmp" "${server[@]}" "${bouncer[@]}") || exit 1
eval "$exports"
export DATABASE_URL CELERY_BROKER_URL
unset CELERY_RESULT_BACKEND  # results go to the broker's Redis
export DJANGO_SETTINGS_MODULE=config.settings.local
export DJANGO_DEBUG=false                    # no query log in the worker or here
export LOG_LEVEL=WARNING LOG_FORMAT=text
export CELERY_WORKER_SEND_TASK_EVENTS=false  # no Flower here: events only cost
export BENCH_DIR="$tmp"

echo "==> migrate" >&2
python manage.py migrate --verbosity 0
if [ "${1:-}" = profile ]; then
  shift
  python -m bench.profile "$@"   # `make profile`: the engine's cost per step, in process
elif [ "${1:-}" = profile-api ]; then
  shift
  python -m bench.profile_api "$@"   # `make profile-api`: an API request's cost by layer
elif [ "${1:-}" = scale ]; then
  shift
  python -m bench.scale "$@"     # one run over fleets of several sizes
elif [ "${1:-}" = capacity ]; then
  shift
  python -m bench.capacity "$@"  # `make capacity`: PostgreSQL's cost of a step and a run
else
  python -m bench.run "$@"
fi
