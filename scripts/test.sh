#!/usr/bin/env bash
# `make test`: throwaway PostgreSQL and Redis on free loopback ports, then ruff, mypy,
# the import contracts and pytest against them. The servers and their data are removed
# on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/orchestrator-test.XXXXXX")
chmod 755 "$tmp"
cleanup() {
  python scripts/local_servers.py stop --dir "$tmp" || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A server that does not start: local_servers.py's one line, and nothing after it.
exports=$(python scripts/local_servers.py start --dir "$tmp" --fast) || exit 1
eval "$exports"
export DATABASE_URL CELERY_BROKER_URL
export DJANGO_SETTINGS_MODULE=config.settings.test
unset CELERY_RESULT_BACKEND

# PYTEST_ONLY=1 (make test-quick): skip the linters, for a developer iterating on a few
# tests; CI never sets it.
if [ "${PYTEST_ONLY:-0}" != 1 ]; then
  echo "==> ruff"
  ruff check .
  ruff format --check .
  echo "==> mypy"
  mypy .
  echo "==> import contracts (docs/architecture.md#layers)"
  lint-imports
fi
# The suite runs in TEST_PROCESSES parallel processes (pytest-xdist; 0: in this one),
# each with its own database and Redis database (config/settings/test.py); the modules
# that start whole stacks of their own stay together in one (tests/conftest.py).
echo "==> pytest"
pytest -n "${TEST_PROCESSES:-2}" "$@"
