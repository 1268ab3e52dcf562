#!/usr/bin/env bash
# Install jumpahead into ./.venv (idempotent). Used by the README and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# --test: also what only the tests need from the system (headless Chromium)
WITH_TESTS=0; [ "${1:-}" = --test ] && WITH_TESTS=1

if [ "$(uname -s)" = Linux ]; then
  # The OpenBLAS wheel (cmeel-openblas) that makes MLX's CPU build fast needs
  # libgfortran.so.5 from the system.
  if ! ldconfig -p 2>/dev/null | grep -q 'libgfortran.so.5 '; then
    if command -v apt-get >/dev/null 2>&1; then
      SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
      echo "installing libgfortran5 (needed by OpenBLAS)"
      $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgfortran5 >/dev/null
    else
      echo "warning: libgfortran.so.5 not found; MLX will fall back to its slow reference BLAS" >&2
    fi
  fi
  # The dashboard's browser test (tests/test_dashboard.py) drives Debian's headless
  # Chromium; it skips where neither is installed. Only with --test: serving needs neither.
  if [ "$WITH_TESTS" = 1 ] && ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "installing chromium and chromium-driver (the dashboard's browser test)"
    { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } ||
      echo "warning: chromium could not be installed; the dashboard's browser test will skip" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "$(uname -s)" = Linux ]; then
  # xgrammar depends on torch; pin the CPU build so pip does not pull a multi-GB CUDA one.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[cpu,test]"
else
  .venv/bin/python -m pip install -q -e ".[test]"
fi
echo "jumpahead installed in $(pwd)/.venv"
