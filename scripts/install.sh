#!/usr/bin/env bash
# Install jumpahead into ./.venv (idempotent). Used by the README and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# --test: also what only the tests need from the system (headless Chromium)
WITH_TESTS=0; [ "${1:-}" = --test ] && WITH_TESTS=1

if [ "$(uname -s)" = Linux ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  # MLX's Linux wheel links a slow reference BLAS; jumpahead binds a faster one at start
  # (engine/machine/blas.py), checked against this CPU. The distribution's OpenBLAS picks its
  # kernels at run time (DYNAMIC_ARCH) and runs on any x86-64 CPU; the cmeel-openblas
  # wheel (built for AVX-512 only) is a checked fallback and needs libgfortran5.
  # With --test: qemu-user too (tests/test_blas_qemu.py runs the choice on emulated CPUs).
  WANT="libopenblas0-pthread libgfortran5"; [ "$WITH_TESTS" = 1 ] && WANT="$WANT qemu-user"
  MISSING=""
  for pkg in $WANT; do dpkg -s "$pkg" >/dev/null 2>&1 || MISSING="$MISSING $pkg"; done
  if [ -n "$MISSING" ] && command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; then
    echo "installing$MISSING"
    { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $MISSING >/dev/null; } ||
      echo "warning: could not install$MISSING; jumpahead will use the fastest BLAS it finds that this CPU runs (see: jumpahead doctor)" >&2
  elif [ -n "$MISSING" ]; then
    echo "note: install your distribution's OpenBLAS (e.g. libopenblas0-pthread) for fast CPU matmuls; see: jumpahead doctor" >&2
  fi
  # The dashboard's browser test (tests/test_dashboard.py) drives Debian's headless
  # Chromium; it skips where neither is installed. Only with --test: serving needs neither.
  if [ "$WITH_TESTS" = 1 ] && ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
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
