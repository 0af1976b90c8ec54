#!/usr/bin/env bash
# Install what is missing: Debian packages (redis-server, PostgreSQL server binaries when
# absent; chromium and its driver for `make test`), the virtualenv, the pinned Python
# requirements and the checkout's client with its `orch` command. Cheap when nothing is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@";
  else echo "need root to run: $*" >&2; exit 1; fi
}

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
command -v psql >/dev/null || missing+=(postgresql-client)
# `make test` (WITH_BROWSER=1): the browser tests drive Debian's chromium and chromedriver.
if [ "${WITH_BROWSER:-0}" = 1 ]; then
  command -v chromium >/dev/null || missing+=(chromium)
  command -v chromedriver >/dev/null || missing+=(chromium-driver)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  # The Debian package starts its own Redis on 6379; ours run on their own ports.
  if [[ " ${missing[*]} " == *" redis-server "* ]]; then
    (as_root service redis-server stop || true) >/dev/null 2>&1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha"
want=$(cat requirements.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing Python requirements"
  # grep: this machine's pip configuration warns once per package about mirrors it skips.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt 2>&1 \
    | { grep -v "^WARNING: Location" || true; }

  echo "$want" > "$stamp"
fi

# The client's console script, $VENV/bin/orch (docs/cli.md): the checkout installed in
# editable mode, so `orch` runs the code as it is; again whenever pyproject.toml changes.
project_stamp="$VENV/.project.sha"
want_project=$(cat pyproject.toml examples/acme_tools/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x "$VENV/bin/orch" ] || [ "$(cat "$project_stamp" 2>/dev/null)" != "$want_project" ]; then
  echo "==> installing the client and its CLI (orch)"
  # PYTHONWARNINGS: setuptools warns at length about every editable install.
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    --no-deps --no-build-isolation -e . 2>&1 | { grep -v "^WARNING: Location" || true; }
  # The example package of tools (docs/tools.md): the fleet loads `acme.word_stats` from
  # its entry point, and `orch worker acme_tools.worker` serves `acme.summarize`.
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    --no-deps --no-build-isolation -e examples/acme_tools 2>&1 | { grep -v "^WARNING: Location" || true; }
  echo "$want_project" > "$project_stamp"
fi
