#!/usr/bin/env bash
# `make load`: the REST API under sustained concurrent load (locust, headless) against
# gunicorn on throwaway PostgreSQL and Redis with real workers; then every run created
# under load must end and be consistent. Not part of `make test`.
#
#   LOAD_USERS=50     concurrent simulated clients
#   LOAD_SECONDS=60   seconds of load once every client is up
#   LOAD_FLOOR_SECONDS=20  seconds of each of the floor, reads and saturated mix phases
#                     before the mix (0: none)
#   LOAD_SEED=1       the seed of the request mix
#   LOAD_JSON=path    also write the report there as JSON
#
# Extra arguments go to `python -m reliability.load` (e.g. --keep, --orgs 5).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
exec python -m reliability.load "$@"
