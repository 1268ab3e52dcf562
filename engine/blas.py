"""Make MLX's CPU build use an optimized BLAS.

The Linux `mlx[cpu]` wheel links the reference netlib BLAS (~6 GFLOP/s for float32
matmul). Loading OpenBLAS with RTLD_GLOBAL *before* mlx is first imported makes the
dynamic linker resolve `sgemm_` and friends to it, restoring 10-30x the speed. This
module must be imported before `mlx.core`; `jumpahead.engine` does so on import.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import sysconfig
from pathlib import Path

_loaded: str | None = None
_reason: str = "not attempted"


def _candidates() -> list[str]:
    env = os.environ.get("JUMPAHEAD_BLAS")
    if env:
        return [env]
    found: list[str] = []
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for root in roots:
        found += sorted(glob.glob(os.path.join(root, "cmeel.prefix", "lib", "libopenblas.so*")))
    found += ["libopenblas.so.0", "libopenblas.so"]
    return found


def load_optimized_blas() -> str | None:
    """Load OpenBLAS globally (Linux only). Returns the path loaded, or None."""
    global _loaded, _reason
    if _loaded is not None or sys.platform != "linux":
        if sys.platform != "linux":
            _reason = "not needed on this platform (Accelerate/Metal)"
        return _loaded
    if os.environ.get("JUMPAHEAD_BLAS") == "none":
        _reason = "disabled by JUMPAHEAD_BLAS=none"
        return None
    if "mlx.core" in sys.modules:
        _reason = "mlx was imported before jumpahead.engine; reference BLAS may be in use"
    for path in _candidates():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        _loaded = path
        if "mlx.core" not in sys.modules:
            _reason = "loaded before mlx"
        return path
    _reason = "no OpenBLAS found (pip install cmeel-openblas)"
    return None


def blas_info() -> dict[str, str | None]:
    """What /health reports: which BLAS library was loaded and why."""
    name = Path(_loaded).name if _loaded else "reference (bundled)"
    if sys.platform != "linux":
        name = "platform"
    return {"library": name, "path": _loaded, "note": _reason}
