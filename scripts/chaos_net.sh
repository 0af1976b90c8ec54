#!/usr/bin/env bash
# `make chaos-net` (root only): make chaos's workload on make cluster's fourteen hosts
# while hosts are partitioned, lost and failed over on a seeded schedule; then every run
# must be terminal and consistent, and every namespace and process is removed.
#
#   CHAOS_SEED=1          the seed of the workload, the fault order and their hosts
#   CHAOS_RUNS=200        runs submitted
#   CHAOS_NET_JSON=path   also write the report there as JSON
#
# Extra arguments go to `python -m reliability.chaos_net` (e.g. --keep).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
exec python -m reliability.chaos_net "$@"
