"""The BLAS choice (engine/machine/blas.py): real build strings against real CPU feature sets,
the probe on real libraries, and the choice this process made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from jumpahead.engine.machine import blas

# numpy's names for the features of real CPUs (as numpy's CPUID dispatch reports them).
_BASE = {"MMX", "SSE", "SSE2", "SSE3", "SSSE3", "SSE41", "POPCNT", "SSE42", "X86_V2", "LAHF", "CX16"}
SANDYBRIDGE = frozenset(_BASE | {"AVX"})
HASWELL = frozenset(_BASE | {"AVX", "F16C", "FMA3", "AVX2", "MOVBE", "BMI", "BMI2", "LZCNT", "X86_V3"})
ZEN1 = HASWELL  # AMD EPYC 7551 (Zen 1): AVX2 and FMA, no AVX-512 (the review's machine)
SKYLAKE_X = frozenset(HASWELL | {"AVX512F", "AVX512CD", "AVX512VL", "AVX512BW", "AVX512DQ", "AVX512_SKX", "X86_V4"})

# What the libraries themselves say (openblas_get_config / openblas_get_corename).
CMEEL_WHEEL = {"kind": "openblas", "config": "OpenBLAS 0.3.31 NO_AFFINITY SKYLAKEX MAX_THREADS=4",
               "corename": "SKYLAKEX", "max_threads": 4, "has_cblas": True}
DEBIAN_ON_ZEN = {"kind": "openblas", "config": "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64",
                 "corename": "Zen", "max_threads": 64, "has_cblas": True}
HASWELL_ONLY = {"kind": "openblas", "config": "OpenBLAS 0.3.26 NO_AFFINITY HASWELL MAX_THREADS=64",
                "corename": "HASWELL", "max_threads": 64, "has_cblas": True}
BLIS = {"kind": "blis", "config": "BLIS 0.9.0", "corename": "zen", "has_cblas": True}


def test_skylakex_wheel_refused_on_zen1_and_named():
    ok, why = blas.decide(CMEEL_WHEEL, ZEN1, "x86_64")
    assert not ok
    assert "SKYLAKEX" in why and "AVX512F" in why


def test_skylakex_wheel_accepted_where_avx512_is():
    assert blas.decide(CMEEL_WHEEL, SKYLAKE_X, "x86_64")[0]


def test_dynamic_arch_and_blis_accepted_on_any_x86():
    for cpu in (SANDYBRIDGE, ZEN1, SKYLAKE_X):
        assert blas.decide(DEBIAN_ON_ZEN, cpu, "x86_64")[0]
        assert blas.decide(BLIS, cpu, "x86_64")[0]


def test_haswell_build_needs_avx2_and_fma():
    assert blas.decide(HASWELL_ONLY, HASWELL, "x86_64")[0]
    ok, why = blas.decide(HASWELL_ONLY, SANDYBRIDGE, "x86_64")
    assert not ok and "AVX2" in why and "FMA3" in why


def test_unknown_single_target_core_refused_on_x86_but_left_to_the_probe_on_arm():
    build = {**HASWELL_ONLY, "config": "OpenBLAS 0.3.40 NEWCORE MAX_THREADS=8", "corename": "NEWCORE"}
    assert not blas.decide(build, SKYLAKE_X, "x86_64")[0]
    assert blas.decide({**build, "corename": "NEOVERSEN1"}, frozenset(), "aarch64")[0]


def test_a_library_without_cblas_is_refused():
    assert not blas.decide({**DEBIAN_ON_ZEN, "has_cblas": False}, SKYLAKE_X, "x86_64")[0]


def _cand(origin: str, mix_ms: float, accepted: bool = True) -> blas.Candidate:
    return blas.Candidate(f"/x/{origin}", origin, accepted, "", {}, {"mix_ms": mix_ms})


def test_choose_prefers_the_users_then_the_clearly_fastest():
    system, blis_, wheel = _cand("system OpenBLAS", 10.0), _cand("system BLIS", 9.0), _cand("wheel cmeel-openblas", 5.0)
    assert blas.choose([system, blis_, wheel]) is wheel  # 2x faster displaces the system one
    assert blas.choose([system, blis_]) is system  # 10% faster is within the noise: keep the order
    user = _cand("JUMPAHEAD_BLAS", 50.0)
    assert blas.choose([user, system, wheel]) is user
    user.accepted = False
    assert blas.choose([user, system, wheel]) is wheel
    assert blas.choose([_cand("system OpenBLAS", 1.0, accepted=False)]) is None


def test_probe_refuses_what_is_not_a_blas(tmp_path, monkeypatch):
    monkeypatch.setenv("JUMPAHEAD_BLAS_CACHE", "off")
    libm = next((p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6")
                 if os.path.exists(p)), None)
    if libm is None:
        pytest.skip("no libm.so.6 at a known path")
    c = blas.examine(blas.Candidate(libm, "JUMPAHEAD_BLAS"), blas.cpu_features())
    assert not c.accepted and "CBLAS" in c.reason
    junk = tmp_path / "libjunk.so"
    junk.write_text("not an ELF file")
    c = blas.examine(blas.Candidate(str(junk), "JUMPAHEAD_BLAS"), blas.cpu_features())
    assert not c.accepted and "cannot be opened" in c.reason
    c = blas.examine(blas.Candidate(str(tmp_path / "absent.so"), "JUMPAHEAD_BLAS"), blas.cpu_features())
    assert not c.accepted and c.reason == "file not found"


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS choice is Linux-only (Accelerate elsewhere)")
def test_this_process_bound_a_checked_blas_and_mlx_computes_right():
    import mlx.core as mx
    import numpy as np

    info = blas.blas_info()
    details = blas.blas_details()
    if info["path"] is None:
        assert info["warnings"], "falling back to the reference BLAS must warn"
    else:
        chosen = next(c for c in details.considered if c["path"] == info["path"])
        assert chosen["accepted"] and chosen["speed"]["gflops"] > 0
    a = np.random.default_rng(1).standard_normal((67, 129)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((129, 33)).astype(np.float32)
    got = np.array(mx.array(a) @ mx.array(b))
    assert np.allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS choice is Linux-only")
def test_a_refused_jumpahead_blas_warns_and_falls_back_without_crashing(tmp_path):
    junk = tmp_path / "libnotblas.so"
    junk.write_text("not an ELF file")
    env = {**os.environ, "JUMPAHEAD_BLAS": str(junk), "JUMPAHEAD_BLAS_CACHE": str(tmp_path / "cache.json")}
    code = ("import jumpahead.engine, json; from jumpahead.engine.machine.blas import blas_info; import mlx.core as mx; "
            "x = mx.ones((8, 8)) @ mx.ones((8, 8)); print(json.dumps(blas_info())); assert float(x.sum()) == 512")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr
    assert f"JUMPAHEAD_BLAS={junk} refused" in done.stderr
    assert "libnotblas" not in (done.stdout.strip().splitlines()[-1].split('"library"')[1].split(",")[0])


def test_doctor_reports_the_choice_and_measures(tmp_path):
    """`jumpahead doctor` in a new process: the CPU, the BLAS it bound and every candidate's
    verdict, a measured MLX matmul rate, the caches, advice (JSON form)."""
    env = {**os.environ, "JUMPAHEAD_BLAS_CACHE": str(tmp_path / "cache.json")}
    done = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "doctor", "--no-model", "--json"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cpu"]["cores"] >= 1 and report["mlx"]["version"]
    assert report["measured"]["mlx_matmul_gflops"] > 0
    b = report["blas"]
    if sys.platform == "linux":
        assert b["candidates"], "at least the wheel or a system library is a candidate here"
        for c in b["candidates"]:
            assert c["accepted"] or c["reason"]
        if b["path"] is None:
            assert any("reference BLAS" in a for a in report["advice"])
        else:
            assert any(c["path"] == b["path"] and c["accepted"] for c in b["candidates"])
    assert isinstance(report["advice"], list) and "sizes" in report["cache"]
    text = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "doctor", "--no-model"], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert text.returncode == 0 and text.stdout.startswith("cpu ") and "blas " in text.stdout


# Row-consistency (engine/machine/blas_probe.py `row_consistency`, blas.py `row_verdict`): a row's
# bits must not depend on how many rows the sgemm call carries, or a row decoded alone differs
# from the same row in a batch, a verify round or prefill.
REFERENCE_BLAS = sorted(Path(sysconfig.get_paths()["platlib"], "mlx_cpu.libs").glob("libblas*.so*"))
WHEEL_OPENBLAS = sorted(Path(sysconfig.get_paths()["platlib"], "cmeel.prefix", "lib").glob("libopenblas.so.0"))
SYSTEM_OPENBLAS = [Path(p) for p in ("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
                                     "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0") if os.path.exists(p)]
PROBE = Path(blas.__file__).with_name("blas_probe.py")


def _probe_check(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-I", str(PROBE), "check", str(path), "nospeed"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stage"] == "check" and result["failures"] == [], result
    return result


def _runnable(path: Path) -> bool:
    if path in WHEEL_OPENBLAS and "AVX512F" not in blas.cpu_features():
        return False  # the SKYLAKEX-only wheel dies with SIGILL here (tests/test_blas_qemu.py covers that)
    return True


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS choice is Linux-only")
@pytest.mark.parametrize("path", REFERENCE_BLAS + WHEEL_OPENBLAS + SYSTEM_OPENBLAS, ids=lambda p: p.parent.name + "/" + p.name)
def test_probe_reports_row_consistency_of_both_layouts_on_the_real_libraries(path):
    """The real probe in a child on every library here: both layouts reported, with the largest
    difference and the first one found; MLX's reference BLAS (plain loops, one summation order
    whatever M) is the positive control."""
    if not _runnable(path):
        pytest.skip("this CPU cannot run this build")
    result = _probe_check(path)
    assert set(result["row_consistent"]) == {"nt", "nn"}
    for layout in ("nt", "nn"):
        ok, diff, detail = result["row_consistent"][layout], result["row_max_diff"][layout], result["row_detail"][layout]
        if ok:
            assert diff == 0.0 and detail is None
        else:
            assert 0.0 < diff < 1e-2, "a summation-order difference, not a wrong product (check() would fail)"
            assert detail.startswith("row ") and ("x @ W.T" if layout == "nt" else "x @ W (") in detail
    if path in REFERENCE_BLAS:
        assert result["row_consistent"] == {"nt": True, "nn": True}, result["row_detail"]
    print(path, result["row_consistent"], result["row_max_diff"], result["row_detail"])


def test_row_mismatch_detects_a_real_summation_order_difference():
    """The probe's comparison on two real float32 products summed in different orders: numpy's
    BLAS (blocked, vectorized) and a sequential sum over K."""
    from jumpahead.engine.machine.blas_probe import row_mismatch

    import numpy as np

    rng = np.random.default_rng(7)
    x = rng.standard_normal(1536, dtype=np.float32)
    w = rng.standard_normal((1536, 576), dtype=np.float32)
    blocked = x @ w
    sequential = np.cumsum(x[:, None] * w, axis=0, dtype=np.float32)[-1]
    assert not np.array_equal(blocked, sequential), "the two orders must round differently somewhere"
    d = row_mismatch(blocked, sequential)
    assert d is not None and d == pytest.approx(float(np.abs(blocked.astype(np.float64) - sequential).max()))
    assert 0 < d < 1e-2
    assert row_mismatch(blocked, blocked.copy()) is None
    assert row_mismatch(np.float32([0.0, 1.0]), np.float32([-0.0, 1.0])) is not None  # bits, not ==
    assert row_mismatch(np.float32([np.nan]), np.float32([1.0])) == float("inf")


_INCONSISTENT_NT = {"row_consistent": {"nt": False, "nn": True}, "row_max_diff": {"nt": 4.6e-05, "nn": 0.0},
                    "row_detail": {"nt": "row 0 alone differs from row 0 of M=4 by 4.6e-05 for x @ W.T (K=576, N=1536)",
                                   "nn": None}}


def test_row_verdict_refuses_a_layout_the_engine_runs_when_required_and_warns_otherwise(monkeypatch):
    refuse, warnings = blas.row_verdict(_INCONSISTENT_NT, require=True)
    assert refuse == "not row-consistent: row 0 alone differs from row 0 of M=4 by 4.6e-05 for x @ W.T (K=576, N=1536)"
    assert warnings == []
    refuse, warnings = blas.row_verdict(_INCONSISTENT_NT, require=False)
    assert refuse is None and len(warnings) == 1 and "x @ W.T" in warnings[0] and "nn.Linear" in warnings[0]
    nn_only = {"row_consistent": {"nt": True, "nn": False}, "row_detail": {"nt": None, "nn": "row 1 ... x @ W"}}
    assert blas.row_verdict(nn_only, require=True)[0] == "not row-consistent: row 1 ... x @ W"  # probs @ v runs it
    assert blas.row_verdict({"row_consistent": {"nt": True, "nn": True}}, require=True) == (None, [])
    assert blas.row_verdict({}, require=True) == (None, [])  # an older probe's result: nothing to judge
    monkeypatch.setenv("JUMPAHEAD_BLAS_ROWS", "require")
    assert blas.row_verdict(_INCONSISTENT_NT)[0] is not None
    monkeypatch.setenv("JUMPAHEAD_BLAS_ROWS", "warn")
    assert blas.row_verdict(_INCONSISTENT_NT)[0] is None


@pytest.mark.skipif(sys.platform != "linux" or not SYSTEM_OPENBLAS + REFERENCE_BLAS, reason="no library to probe")
def test_examine_applies_the_row_verdict_to_the_real_probe(tmp_path, monkeypatch):
    """examine() on a real library: the probe's row result is kept (and cached), and the verdict
    follows $JUMPAHEAD_BLAS_ROWS on the cached result without probing again."""
    monkeypatch.setenv("JUMPAHEAD_BLAS_CACHE", str(tmp_path / "cache.json"))
    path = str((SYSTEM_OPENBLAS or REFERENCE_BLAS)[0])
    monkeypatch.setenv("JUMPAHEAD_BLAS_ROWS", "warn")
    warned = blas.examine(blas.Candidate(path, "JUMPAHEAD_BLAS"), blas.cpu_features())
    assert warned.accepted, warned.reason
    rows = warned.rows["row_consistent"]
    assert set(rows) == {"nt", "nn"}
    assert len(warned.warnings) == sum(not ok for ok in rows.values())
    cached = json.loads((tmp_path / "cache.json").read_text())
    assert [e["rows"] for e in cached.values()] == [warned.rows]
    monkeypatch.setenv("JUMPAHEAD_BLAS_ROWS", "require")
    strict = blas.examine(blas.Candidate(path, "JUMPAHEAD_BLAS"), blas.cpu_features())
    if all(rows.values()):
        assert strict.accepted
    else:
        assert not strict.accepted and strict.reason.startswith("not row-consistent: row ")


SPIN_CODE = """
import json, resource, time
import jumpahead.engine
import mlx.core as mx
from jumpahead.engine.machine.blas import blas_info
a = mx.random.normal((512, 576)); w = mx.random.normal((1536, 576)); mx.eval(a, w)
spun = []
for _ in range(5):
    mx.eval(a @ w.T)  # a threaded sgemm: the library's workers then idle
    t0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    time.sleep(0.05)  # this thread sleeps; any CPU time now is the idle workers spinning
    spun.append(resource.getrusage(resource.RUSAGE_SELF).ru_utime - t0)
print(json.dumps({"info": blas_info(), "spun_s": sorted(spun)[2]}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS choice is Linux-only")
@pytest.mark.parametrize("users", [None, "30"])
def test_openblas_idle_workers_sleep_soon_unless_the_user_says_otherwise(users, tmp_path):
    """The engine loads OpenBLAS with OPENBLAS_THREAD_TIMEOUT=22 (engine/machine/blas.py):
    measured by what it is for, the CPU time the library's idle workers burn while the
    calling thread sleeps 50 ms after a threaded sgemm (the blocked prefill attention's
    threads need those cores); a user's own value is kept and read by the library."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS",
                                                             "JUMPAHEAD_BLAS_THREADS")}
    if users:
        env["OPENBLAS_THREAD_TIMEOUT"] = users
    done = subprocess.run([sys.executable, "-c", SPIN_CODE], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    info = out["info"]
    if not info["path"] or "openblas" not in (info["library"] or "").lower() or (info["threads"] or 1) < 2:
        pytest.skip(f"needs a threaded OpenBLAS bound (bound: {info['library']}, threads {info['threads']})")
    assert info["thread_timeout"] == (users or blas.THREAD_TIMEOUT)
    # measured here (2 cores, OpenBLAS 0.3.21): 22 -> 1.4 ms of the 50 ms, 28 (the library's
    # default) 3-11 ms, 30 -> 54 ms (a worker spins through the whole sleep)
    if users:
        assert out["spun_s"] > 0.025, out
    else:
        assert out["spun_s"] < 0.008, out
