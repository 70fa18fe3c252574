#!/usr/bin/env bash
# transformer_jax: the one entry point.
#
#   ./launch.sh test [PYTEST_ARGS...]   run the test suite on the CPU
#   ./launch.sh setup                   only create/refresh the virtual environment
#
# Set-up happens on first use: a virtual environment in $TJ_VENV (default
# ./.venv) with the package and its test extra installed. It is refreshed when
# pyproject.toml changes. Any failure exits non-zero.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
VENV="${TJ_VENV:-.venv}"
PY="$VENV/bin/python"

setup() {
  local stamp="$VENV/.transformer_jax-installed"
  local want
  want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [[ -x "$PY" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  echo "launch.sh: setting up $VENV (one time; a few minutes)" >&2
  [[ -x "$PY" ]] || python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
  "$PY" -m pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
}

mode="${1:-test}"
[[ $# -gt 0 ]] && shift
case "$mode" in
  setup) setup ;;
  test)
    setup
    exec "$PY" -m pytest -q "$@"
    ;;
  -h|--help|help)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    ;;
  *)
    echo "launch.sh: unknown mode '$mode' (try: ./launch.sh help)" >&2
    exit 2
    ;;
esac
