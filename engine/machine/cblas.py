"""The bound BLAS's `cblas_sgemv` and `cblas_sgemm`, called directly (ctypes).

MLX calls only `cblas_sgemm`; OpenBLAS's sgemm packs its operands, so at one row it
reads weights at about half the rate its `cblas_sgemv` does (`jumpahead bench roofline`).
engine/kv/row_gemv.py calls sgemv on a decode row's linears, and the roofline bench
measures both rates, through this one binding of the library engine/machine/blas.py chose.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import blas

RowMajor, NoTrans, Trans = 101, 111, 112


class Cblas:
    """cblas_sgemv / cblas_sgemm of a loaded library (int width from its build)."""

    def __init__(self, lib: ctypes.CDLL, int64: bool = False) -> None:
        I = ctypes.c_int64 if int64 else ctypes.c_int  # noqa: E741
        P, F = ctypes.c_void_p, ctypes.c_float
        self.gemv = lib.cblas_sgemv
        self.gemv.argtypes = [ctypes.c_int, ctypes.c_int, I, I, F, P, I, P, I, F, P, I]
        self.gemv.restype = None
        self.gemm = lib.cblas_sgemm
        self.gemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, I, I, I, F, P, I, P, I, F, P, I]
        self.gemm.restype = None

    def sgemv(self, w: np.ndarray, x: np.ndarray, y: np.ndarray, beta: float = 0.0) -> None:
        """y [N] = w [N, K] @ x [K] (+ beta * y); every array C-contiguous float32."""
        m, n = w.shape
        self.gemv(RowMajor, NoTrans, m, n, 1.0, w.ctypes.data, n, x.ctypes.data, 1, beta, y.ctypes.data, 1)

    def sgemm_xwt(self, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> None:
        """y [M, N] = x [M, K] @ w [N, K]^T, as MLX calls it for a Linear layer."""
        m, k = x.shape
        n = w.shape[0]
        self.gemm(RowMajor, NoTrans, Trans, m, n, k, 1.0, x.ctypes.data, k, w.ctypes.data, k, 0.0,
                  y.ctypes.data, n)


_bound: list[Cblas | None] = []


def bound_cblas() -> Cblas | None:
    """The library MLX's cblas_sgemm resolves to (engine/machine/blas.py bound it), or None
    (MLX's reference BLAS: no sgemv worth calling)."""
    if _bound:
        return _bound[0]
    info = blas.blas_info()
    found = None
    if info.get("path"):
        try:
            lib = ctypes.CDLL(info["path"], mode=ctypes.RTLD_GLOBAL)  # already loaded: the same handle
            found = Cblas(lib, int64="USE64BITINT" in str(info.get("config") or "").split())
        except (OSError, AttributeError):
            found = None
    _bound.append(found)
    return found
