#!/usr/bin/env bash
# Smoke: the BLAS choice and MLX's matmuls in a new process (jumpahead doctor, no model).
# A crash is named here, instead of the whole test run dying with a silent rc 132.
cd "$(dirname "$0")/.."
.venv/bin/jumpahead doctor --no-model && exit 0
rc=$?
case $rc in
  132|-4) why="SIGILL: a library executed an instruction this CPU lacks";;
  134) why="SIGABRT";; 139) why="SIGSEGV";; *) why="exit status $rc";;
esac
echo "smoke failed: jumpahead doctor --no-model died ($why) on $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2)" >&2
exit $rc
