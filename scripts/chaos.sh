#!/usr/bin/env bash
# `make chaos`: the whole stack (throwaway PostgreSQL and Redis, web, two workers, beat)
# under a mixed workload while faults are injected on a seeded schedule; then every run
# must be terminal and consistent. Not part of `make test` (a short version is).
#
#   CHAOS_SEED=1      the seed of the workload and the fault schedule
#   CHAOS_RUNS=200    runs submitted
#   CHAOS_JSON=path   also write the report there as JSON
#
# Extra arguments go to `python -m reliability.chaos` (e.g. --short, --keep).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
exec python -m reliability.chaos "$@"
