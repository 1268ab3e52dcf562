"""Probe one BLAS library in a child process: what build it is, whether it computes right, how fast.

Run as a script (`python -I blas_probe.py MODE PATH [nospeed]`), never imported by the server: a
library built for instructions this CPU lacks dies with SIGILL, and it must die here,
not in the server (engine/machine/blas.py reads the exit status). It imports nothing of
jumpahead (importing `jumpahead.engine` would bind a BLAS itself) and only numpy besides
the standard library: numpy's own BLAS is symbol-prefixed, so it never clashes with the
library under test, which is opened RTLD_LOCAL.

MODE `info` prints the build (OpenBLAS config and core, BLIS version and kernel set).
MODE `check` also runs the calls MLX makes (cblas_sgemm with beta != 0 in every
transpose, cblas_dgemm, cblas_cgemm; LAPACK's Fortran sgemm_; sgemv) against a float64
reference, checks that cblas_sgemm is row-consistent (`row_consistency`: a row's bits do
not depend on how many rows M the call carries), then times GEMMs (`speed`). One JSON
object on stdout; a crash is an exit status.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def _string(lib: ctypes.CDLL, name: str) -> str | None:
    fn = getattr(lib, name, None)
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    value = fn()
    return value.decode(errors="replace") if value else None


def _int(lib: ctypes.CDLL, name: str) -> int | None:
    fn = getattr(lib, name, None)
    if fn is None:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return int(fn())


def build_info(lib: ctypes.CDLL) -> dict:
    """The library's own account of its build."""
    info: dict = {"kind": "unknown"}
    config = _string(lib, "openblas_get_config")
    if config is not None:
        info.update(kind="openblas", config=config, corename=_string(lib, "openblas_get_corename"),
                    max_threads=None, threads=_int(lib, "openblas_get_num_threads"))
        for word in config.split():
            if word.startswith("MAX_THREADS="):
                info["max_threads"] = int(word.split("=", 1)[1])
    elif getattr(lib, "bli_info_get_version_str", None) is not None:
        info.update(kind="blis", config="BLIS " + (_string(lib, "bli_info_get_version_str") or "?"))
        query = getattr(lib, "bli_arch_query_id", None)
        arch_string = getattr(lib, "bli_arch_string", None)
        if query is not None and arch_string is not None:
            query.restype = ctypes.c_int
            arch_string.restype = ctypes.c_char_p
            arch_string.argtypes = [ctypes.c_int]
            info["corename"] = (arch_string(query()) or b"?").decode()
    info["has_cblas"] = getattr(lib, "cblas_sgemm", None) is not None
    return info


def _ptr(a, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def check(lib: ctypes.CDLL) -> list[str]:
    """The calls MLX makes, against a float64 reference; returns the failures."""
    import numpy as np

    rng = np.random.default_rng(0)
    failures: list[str] = []
    sgemm, dgemm, cgemm = lib.cblas_sgemm, lib.cblas_dgemm, lib.cblas_cgemm
    i, f, d = ctypes.c_int, ctypes.c_float, ctypes.c_double
    P = ctypes.c_void_p
    sgemm.argtypes = [i, i, i, i, i, i, f, P, i, P, i, f, P, i]
    dgemm.argtypes = [i, i, i, i, i, i, d, P, i, P, i, d, P, i]
    cgemm.argtypes = [i, i, i, i, i, i, P, P, i, P, i, P, P, i]
    for (m, n, k) in [(1, 1, 1), (3, 5, 7), (1, 96, 64), (33, 17, 65), (64, 64, 64), (97, 130, 71)]:
        for ta in (NO_TRANS, TRANS):
            for tb in (NO_TRANS, TRANS):
                a = rng.standard_normal((k, m) if ta == TRANS else (m, k)).astype(np.float32)
                b = rng.standard_normal((n, k) if tb == TRANS else (k, n)).astype(np.float32)
                c = rng.standard_normal((m, n)).astype(np.float32)
                A = a.T.astype(np.float64) if ta == TRANS else a.astype(np.float64)
                B = b.T.astype(np.float64) if tb == TRANS else b.astype(np.float64)
                want = 0.75 * (A @ B) + 0.5 * c.astype(np.float64)
                sgemm(ROW_MAJOR, ta, tb, m, n, k, 0.75, a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1],
                      0.5, c.ctypes.data, n)
                if not np.allclose(c, want, rtol=1e-3, atol=1e-3 * max(1.0, k ** 0.5)):
                    failures.append(f"cblas_sgemm {m}x{n}x{k} trans={ta - 111}{tb - 111} beta=0.5 wrong")
    a, b = rng.standard_normal((31, 45)), rng.standard_normal((45, 29))
    c = rng.standard_normal((31, 29))
    want = 2.0 * (a @ b) - 1.0 * c
    dgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, 31, 29, 45, 2.0, a.ctypes.data, 45, b.ctypes.data, 29, -1.0, c.ctypes.data, 29)
    if not np.allclose(c, want, rtol=1e-9, atol=1e-9):
        failures.append("cblas_dgemm 31x29x45 wrong")
    a = (rng.standard_normal((9, 13)) + 1j * rng.standard_normal((9, 13))).astype(np.complex64)
    b = (rng.standard_normal((13, 11)) + 1j * rng.standard_normal((13, 11))).astype(np.complex64)
    c = np.zeros((9, 11), np.complex64)
    one, zero = np.array([1, 0], np.float32), np.array([0, 0], np.float32)
    cgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, 9, 11, 13, one.ctypes.data, a.ctypes.data, 13, b.ctypes.data, 11,
          zero.ctypes.data, c.ctypes.data, 11)
    if not np.allclose(c, a.astype(np.complex128) @ b.astype(np.complex128), rtol=1e-3, atol=1e-3):
        failures.append("cblas_cgemm 9x11x13 wrong")
    # LAPACK (bundled with MLX) calls the Fortran symbol, column-major, by reference.
    fortran = getattr(lib, "sgemm_", None)
    if fortran is None:
        failures.append("no Fortran sgemm_ (LAPACK would call the reference BLAS)")
    else:
        m, n, k = 23, 19, 37
        a = np.asfortranarray(rng.standard_normal((m, k)).astype(np.float32))
        b = np.asfortranarray(rng.standard_normal((k, n)).astype(np.float32))
        c = np.asfortranarray(rng.standard_normal((m, n)).astype(np.float32))
        want = a.astype(np.float64) @ b.astype(np.float64) + 0.25 * c.astype(np.float64)
        N, ci = ctypes.c_char(b"N"), ctypes.c_int
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.25)
        fortran(ctypes.byref(N), ctypes.byref(N), ctypes.byref(ci(m)), ctypes.byref(ci(n)), ctypes.byref(ci(k)),
                ctypes.byref(alpha), ctypes.c_void_p(a.ctypes.data), ctypes.byref(ci(m)),
                ctypes.c_void_p(b.ctypes.data), ctypes.byref(ci(k)), ctypes.byref(beta),
                ctypes.c_void_p(c.ctypes.data), ctypes.byref(ci(m)))
        if not np.allclose(c, want, rtol=1e-3, atol=1e-3):
            failures.append("Fortran sgemm_ 23x19x37 beta=0.25 wrong")
    sgemv = getattr(lib, "cblas_sgemv", None)
    if sgemv is not None:
        sgemv.argtypes = [i, i, i, i, f, P, i, P, i, f, P, i]
        a = rng.standard_normal((40, 33)).astype(np.float32)
        x = rng.standard_normal(33).astype(np.float32)
        y = rng.standard_normal(40).astype(np.float32)
        want = a.astype(np.float64) @ x + 2.0 * y
        sgemv(ROW_MAJOR, NO_TRANS, 40, 33, 1.0, a.ctypes.data, 33, x.ctypes.data, 1, 2.0, y.ctypes.data, 1)
        if not np.allclose(y, want, rtol=1e-3, atol=1e-3):
            failures.append("cblas_sgemv 40x33 wrong")
    return failures


# Row-consistency: every exactness oracle of the engine compares a row computed alone
# (decode, M = 1 per row) with the same row inside a batch (B rows), a verify round
# (B * (1 + k) rows) or a prefill chunk (512 rows); that holds only if cblas_sgemm gives
# a row the same bits whatever M is. OpenBLAS picks kernels by size (GEMV forwarding at
# M = 1, small-matrix kernels below ~1e6 M*N*K, the blocked kernel above), and they sum
# in different orders. Layouts as MLX passes them (mlx/backend/cpu/gemms/cblas.cpp):
# "nt" = x @ W.T with W stored N x K (nn.Linear, tied embeddings' as_linear, attention's
# q @ k.T), "nn" = x @ W (attention's probs @ v). (K, N): a small model's decode shapes
# (SmolLM2-135M: hidden 576, MLP 1536, 3 KV heads x 64) and attention at ~1k keys.
ROW_SHAPES = {"nt": [(576, 1536), (1536, 576), (576, 576), (576, 192), (64, 1031)],
              "nn": [(576, 1536), (1536, 576), (576, 192), (1031, 64)]}
ROW_COUNTS = (2, 3, 4, 8, 16, 512)  # decode batches, verify rounds, a prefill chunk
LAYOUT_NAMES = {"nt": "x @ W.T", "nn": "x @ W"}


def row_mismatch(alone, batched) -> float | None:
    """None where two float32 rows have the same bits, else their largest difference
    (inf where a NaN or infinity is in one and not the other)."""
    import numpy as np

    a, b = np.ascontiguousarray(alone, np.float32), np.ascontiguousarray(batched, np.float32)
    if a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)):
        return None
    if a.shape != b.shape:
        return float("inf")
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max()) if float(diff.max()) > 0 else float(np.finfo(np.float32).tiny)  # -0.0 vs 0.0


def row_consistency(lib: ctypes.CDLL) -> dict:
    """For each layout: do rows 0 and M // 2 of an M-row cblas_sgemm (M in ROW_COUNTS)
    have the bits of the same row computed alone (M = 1)? Returns {layout: {"consistent",
    "max_diff", "detail" (the first difference found, for a refusal's reason), "checked"}}."""
    import numpy as np

    sgemm = lib.cblas_sgemm
    i, f, P = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    sgemm.argtypes = [i, i, i, i, i, i, f, P, i, P, i, f, P, i]
    rng = np.random.default_rng(1)
    m_max = max(ROW_COUNTS)
    out: dict = {}
    for layout, shapes in ROW_SHAPES.items():
        tb = TRANS if layout == "nt" else NO_TRANS
        worst, detail, checked = 0.0, None, 0
        for k, n in shapes:
            x = rng.standard_normal((m_max, k), dtype=np.float32)
            w = rng.standard_normal((n, k) if tb == TRANS else (k, n), dtype=np.float32)

            def product(rows, m):
                c = np.empty((m, n), np.float32)
                sgemm(ROW_MAJOR, NO_TRANS, tb, m, n, k, 1.0, rows.ctypes.data, k, w.ctypes.data, w.shape[1], 0.0,
                      c.ctypes.data, n)
                return c

            alone: dict[int, object] = {}
            for m in ROW_COUNTS:
                batch = product(x, m)
                for r in sorted({0, m // 2}):
                    if r not in alone:
                        alone[r] = product(np.ascontiguousarray(x[r:r + 1]), 1)[0]
                    checked += 1
                    d = row_mismatch(alone[r], batch[r])
                    if d is not None:
                        if detail is None:
                            detail = (f"row {r} alone differs from row {r} of M={m} by {d:.2g} for "
                                      f"{LAYOUT_NAMES[layout]} (K={k}, N={n})")
                        worst = max(worst, d)
        out[layout] = {"consistent": detail is None, "max_diff": worst, "detail": detail, "checked": checked}
    return out


def _best_time(sgemm, m: int, k: int, n: int, budget_s: float) -> float:
    import numpy as np

    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    c = np.zeros((m, n), np.float32)
    best, spent, runs = float("inf"), 0.0, 0
    while runs < 8 or (spent < budget_s and runs < 40):
        t = time.perf_counter()
        sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0, c.ctypes.data, n)
        dt = time.perf_counter() - t
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best


def speed(lib: ctypes.CDLL, budget_s: float = 0.3) -> dict:
    """Best-of-many float32 GEMM times: 512^3 (the GFLOP/s figure), and the shapes of a
    small model's layer at decode (1 row) and prefill (256 rows); `mix_ms` (32 decode
    products and one prefill product) is what candidates are ranked by."""
    sgemm = lib.cblas_sgemm
    _best_time(sgemm, 64, 64, 64, 0.05)  # wake the thread pool
    square = _best_time(sgemm, 512, 512, 512, budget_s)
    decode = _best_time(sgemm, 1, 576, 1536, budget_s)
    prefill = _best_time(sgemm, 256, 576, 1536, budget_s)
    return {"gflops": round(2 * 512 ** 3 / square / 1e9, 1),
            "decode_gflops": round(2 * 576 * 1536 / decode / 1e9, 1),
            "prefill_gflops": round(2 * 256 * 576 * 1536 / prefill / 1e9, 1),
            "mix_ms": round((32 * decode + prefill) * 1e3, 3)}


def main(argv: list[str]) -> int:
    mode, path = argv[1], argv[2]
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    out = build_info(lib)
    if mode == "check":
        sys.stdout.write(json.dumps({"stage": "info", **out}) + "\n")
        sys.stdout.flush()  # the build is known even if the checks below crash
        if not out["has_cblas"]:
            out["failures"] = ["no CBLAS interface (MLX calls cblas_sgemm)"]
        else:
            out["failures"] = check(lib)
            if not out["failures"]:
                rows = row_consistency(lib)
                out["row_consistent"] = {layout: r["consistent"] for layout, r in rows.items()}
                out["row_max_diff"] = {layout: r["max_diff"] for layout, r in rows.items()}
                out["row_detail"] = {layout: r["detail"] for layout, r in rows.items()}
            if not out["failures"] and len(argv) < 4:  # "nospeed": under an emulator timings mean nothing
                out.update(speed(lib))
    sys.stdout.write(json.dumps({"stage": mode, **out}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
