"""Choose and bind the BLAS that MLX's CPU build uses, without ever crashing the process.

The Linux `mlx[cpu]` wheel links the reference netlib BLAS (~3-6 GFLOP/s). Loading an
optimized library with RTLD_GLOBAL *before* mlx is first imported makes the dynamic
linker resolve `cblas_sgemm` and friends to it (10-50x faster matmuls). But a library
built for instructions this CPU lacks dies with SIGILL in the first matmul: the
`cmeel-openblas` wheel is built for SKYLAKEX (AVX-512) alone. So before binding anything:

1. each candidate (`$JUMPAHEAD_BLAS`, the system's OpenBLAS and BLIS, the wheel) is
   opened in a child process (engine/machine/blas_probe.py) that reports its build;
2. the build is checked against this CPU's features, read by CPUID as numpy's runtime
   dispatch reads them (so an emulated CPU is seen as it is, not as /proc/cpuinfo of
   the host says): `DYNAMIC_ARCH` builds and BLIS pick kernels at run time; a
   single-target OpenBLAS needs its core's features (`decide`);
3. as a safety net the child runs the calls MLX makes against a float64 reference and
   times them; a crash there is a rejection, not ours; it also checks that cblas_sgemm
   is row-consistent (a row's bits do not depend on the call's row count M) in the two
   layouts the engine runs, whose verdict `row_verdict` draws;
4. the fastest accepted candidate is bound (a clear margin is needed to displace the
   preferred order: user's, system OpenBLAS, system BLIS, wheel); none accepted means the
   reference BLAS with a loud warning.

Results are cached per library file and CPU feature set in the jumpahead home. This
module must run before `mlx.core` is imported; `jumpahead.engine` does so on import.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import json
import logging
import os
import platform
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .home import jumpahead_home

log = logging.getLogger("jumpahead.engine.machine.blas")

PROBE_VERSION = 3  # bump when blas_probe.py's checks change: cached verdicts are redone
PROBE_TIMEOUT_S = 180.0  # an emulated CPU (qemu) runs the probe ~20x slower
DISPLACE_MARGIN = 1.25  # a later candidate must be this much faster to displace an earlier one

# Features (numpy's names) the kernels of a single-target OpenBLAS build execute.
# OpenBLAS names cores by the microarchitecture its kernels were written for.
_SSE3 = {"SSE", "SSE2", "SSE3"}
_SSSE3 = _SSE3 | {"SSSE3"}
_NEHALEM = _SSSE3 | {"SSE41", "SSE42", "POPCNT"}
_AVX = _NEHALEM | {"AVX"}
_AVX2 = _AVX | {"AVX2", "FMA3"}
_SKX = _AVX2 | {"AVX512F", "AVX512CD", "AVX512BW", "AVX512DQ", "AVX512VL"}
CORE_FEATURES: dict[str, set[str]] = {
    "PRESCOTT": _SSE3, "CORE2": _SSSE3, "PENRYN": _SSSE3 | {"SSE41"}, "DUNNINGTON": _SSSE3 | {"SSE41"},
    "ATOM": _SSSE3, "NEHALEM": _NEHALEM, "OPTERON_SSE3": _SSE3, "BARCELONA": _SSE3,
    "BOBCAT": _SSSE3, "SANDYBRIDGE": _AVX, "BULLDOZER": _AVX | {"FMA4"},
    "PILEDRIVER": _AVX | {"FMA3"}, "STEAMROLLER": _AVX | {"FMA3"}, "EXCAVATOR": _AVX2,
    "HASWELL": _AVX2, "ZEN": _AVX2, "SKYLAKEX": _SKX, "COOPERLAKE": _SKX | {"AVX512BF16"},
    "SAPPHIRERAPIDS": _SKX | {"AVX512BF16", "AVX512FP16"},
}


# The cblas_sgemm layouts the engine runs on the CPU, and where (mlx/backend/cpu/gemms/
# cblas.cpp passes MLX's strides as transpose flags). Both are on the decode path: every
# row-consistency failure in them can change a row's bits between decoding alone, a
# batch, a verify round and a prefill chunk.
ENGINE_LAYOUTS = {
    "nt": "x @ W.T: nn.Linear (weights N x K), tied embeddings' as_linear, attention's q @ k.T",
    "nn": "x @ W: attention's probs @ v (engine/kv/attention.py, mx.fast.scaled_dot_product_attention's CPU fallback)",
}
# A candidate that is not row-consistent in a layout the engine runs is refused where this
# is True (`$JUMPAHEAD_BLAS_ROWS=require` sets it, `=warn` clears it); otherwise accepted with a
# warning. Measured on the development machine (tests/test_blas_choice.py prints it): both
# OpenBLAS builds there (Debian 0.3.21 DYNAMIC_ARCH, the cmeel 0.3.31 SKYLAKEX wheel) fail both layouts
# (e.g. K=1536, N=576: M=1 differs from M>=2 by ~5e-5; K=576, N=192: M<=6 from M>=7),
# while MLX's bundled reference BLAS is row-consistent but ~19x slower, so refusing is
# left to the choice of whoever runs the server.
REQUIRE_ROW_CONSISTENT = False


def _require_rows() -> bool:
    mode = os.environ.get("JUMPAHEAD_BLAS_ROWS", "").strip().lower()
    return mode == "require" if mode in ("require", "warn") else REQUIRE_ROW_CONSISTENT


def row_verdict(result: dict, require: bool | None = None) -> tuple[str | None, list[str]]:
    """From a probe's check result: (the reason to refuse, or None; warnings). A layout the
    engine runs (ENGINE_LAYOUTS) that is not row-consistent refuses where `require` (default:
    `_require_rows()`), else warns; one it does not run only warns. A result without the
    row check (an older probe) refuses nothing."""
    require = _require_rows() if require is None else require
    consistent = result.get("row_consistent") or {}
    details = result.get("row_detail") or {}
    refuse: list[str] = []
    warnings: list[str] = []
    for layout, ok in consistent.items():
        if ok:
            continue
        detail = details.get(layout) or f"rows differ for layout {layout}"
        if layout in ENGINE_LAYOUTS and require:
            refuse.append(detail)
        else:
            used = f" (the engine runs it: {ENGINE_LAYOUTS[layout]})" if layout in ENGINE_LAYOUTS else ""
            warnings.append(f"not row-consistent: {detail}{used}; a row decoded alone may differ in its last bits "
                            "from the same row in a batch, a verify round or prefill")
    return ("not row-consistent: " + "; ".join(refuse) if refuse else None), warnings


def cpu_features() -> frozenset[str]:
    """This CPU's features as numpy's runtime dispatch reads them (CPUID)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__
    return frozenset(name for name, on in __cpu_features__.items() if on)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def decide(build: dict, features: frozenset[str], machine: str | None = None) -> tuple[bool, str]:
    """Can this CPU run this build? (static part of the choice; the probe is the net)."""
    machine = machine or platform.machine()
    if not build.get("has_cblas", False):
        return False, "no CBLAS interface (MLX calls cblas_sgemm)"
    kind = build.get("kind")
    if kind == "blis":
        return True, f"{build.get('config')}: picks its kernels at run time ({build.get('corename')})"
    if kind != "openblas":
        return True, "not OpenBLAS or BLIS: no build facts; the probe decides"
    config = str(build.get("config", ""))
    if "DYNAMIC_ARCH" in config.split():
        return True, f"DYNAMIC_ARCH build: picks its kernels at run time ({build.get('corename')})"
    if machine not in ("x86_64", "AMD64", "i686", "i386"):
        return True, f"single-target {machine} build ({build.get('corename')}); the probe decides"
    core = str(build.get("corename") or "").upper()
    need = CORE_FEATURES.get(core)
    if need is None:
        return False, f"single-target build for core {core or '?'} whose instruction needs are unknown"
    missing = sorted(need - features)
    if missing:
        return False, f"built for {core} only; this CPU lacks {', '.join(missing)}"
    return True, f"built for {core}; this CPU has what it needs"


@dataclass
class Candidate:
    path: str
    origin: str  # "JUMPAHEAD_BLAS", "system OpenBLAS", "system BLIS", "wheel cmeel-openblas"
    accepted: bool = False
    reason: str = ""
    build: dict = field(default_factory=dict)
    speed: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)  # the probe's row_consistent / row_max_diff / row_detail
    warnings: list[str] = field(default_factory=list)


def _multiarch_dirs() -> list[str]:
    arch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    return [f"/usr/lib/{arch}", f"/lib/{arch}", "/usr/lib64", "/usr/lib", "/usr/local/lib"]


def candidates() -> list[Candidate]:
    """Every BLAS found here, in order of preference."""
    found: list[Candidate] = []
    if env := os.environ.get("JUMPAHEAD_BLAS"):
        found.append(Candidate(env, "JUMPAHEAD_BLAS"))
    for d in _multiarch_dirs():
        for name in ("openblas-pthread/libopenblas.so.0", "libopenblas.so.0", "openblas-openmp/libopenblas.so.0"):
            found.append(Candidate(os.path.join(d, name), "system OpenBLAS"))
        for name in ("blis-pthread/libblis.so.4", "libblis.so.4", "blis-openmp/libblis.so.4"):
            found.append(Candidate(os.path.join(d, name), "system BLIS"))
    for root in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for p in sorted(glob.glob(os.path.join(root, "cmeel.prefix", "lib", "libopenblas.so.0"))):
            found.append(Candidate(p, "wheel cmeel-openblas"))
    seen: set[str] = set()
    unique: list[Candidate] = []
    for c in found:
        real = os.path.realpath(c.path)
        if c.origin == "JUMPAHEAD_BLAS" or (os.path.exists(real) and real not in seen):
            seen.add(real)
            unique.append(c)
    return unique


def _cache_file() -> Path:
    """`$JUMPAHEAD_BLAS_CACHE` (a file, or `off`), else blas-probe.json in the jumpahead home."""
    return Path(os.environ.get("JUMPAHEAD_BLAS_CACHE") or jumpahead_home() / "blas-probe.json")


def _cache_key(path: str, features: frozenset[str], threads: int | None) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    text = f"{PROBE_VERSION}|{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{threads}|{','.join(sorted(features))}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _read_cache() -> dict:
    if os.environ.get("JUMPAHEAD_BLAS_CACHE") == "off" or os.environ.get("JUMPAHEAD_BLAS_REPROBE"):
        return {}
    try:
        return json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, value: dict) -> None:
    if os.environ.get("JUMPAHEAD_BLAS_CACHE") == "off":
        return
    try:
        cache = _read_cache()
        cache[key] = value
        target = _cache_file()
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, target)
    except OSError as e:  # a read-only home costs a probe per start, nothing else
        log.debug("blas probe cache not written: %s", e)


def _run_probe(mode: str, path: str, threads: int | None) -> tuple[int, list[dict], str]:
    """Run engine/machine/blas_probe.py in a child; `$JUMPAHEAD_BLAS_PROBE_WRAPPER` (e.g. an
    emulator command) runs it the way the parent runs, where exec would escape it."""
    probe = str(Path(__file__).with_name("blas_probe.py"))
    wrapper = os.environ.get("JUMPAHEAD_BLAS_PROBE_WRAPPER", "").split()
    env = dict(os.environ)
    if threads:
        env["OPENBLAS_NUM_THREADS"] = env["BLIS_NUM_THREADS"] = str(threads)
    try:
        extra = ["nospeed"] if wrapper else []  # an emulator's timings mean nothing and cost minutes
        done = subprocess.run([*wrapper, sys.executable, "-I", probe, mode, path, *extra], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return -999, [], f"probe timed out after {PROBE_TIMEOUT_S:.0f} s"
    lines = []
    for line in done.stdout.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return done.returncode, lines, done.stderr[-400:]


def _exit_reason(rc: int, stderr: str) -> str:
    if rc == -999:
        return stderr
    if rc in (-4, 132) or "Illegal instruction" in stderr:
        return "crashed with SIGILL (an instruction this CPU lacks) in the probe"
    if rc < 0:
        return f"probe died with signal {-rc}"
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return f"probe failed (exit {rc}){': ' + tail if tail else ''}"


def examine(c: Candidate, features: frozenset[str], threads: int | None = None, use_cache: bool = True) -> Candidate:
    """Fill in a candidate's build, verdict and speed (cached per library and CPU)."""
    key = _cache_key(c.path, features, threads)
    if key is None:
        c.accepted, c.reason = False, "file not found"
        return c
    if use_cache and (hit := _read_cache().get(key)):  # $JUMPAHEAD_BLAS_REPROBE: read nothing, write anew
        c.accepted, c.reason, c.build, c.speed = hit["accepted"], hit["reason"], hit["build"], hit["speed"]
        c.rows = hit.get("rows", {})
        return _apply_rows(c)
    rc, lines, err = _run_probe("info", c.path, threads)
    if rc != 0 or not lines:
        c.accepted, c.reason = False, "cannot be opened: " + _exit_reason(rc, err)
    else:
        c.build = {k: v for k, v in lines[-1].items() if k != "stage"}
        ok, why = decide(c.build, features)
        c.accepted, c.reason = ok, why
        if ok:
            rc, lines, err = _run_probe("check", c.path, threads)
            result = lines[-1] if lines and lines[-1].get("stage") == "check" else None
            if rc != 0 or result is None:
                c.accepted, c.reason = False, _exit_reason(rc, err)
            elif result.get("failures"):
                c.accepted, c.reason = False, "wrong results: " + "; ".join(result["failures"])
            else:
                c.speed = {k: result[k] for k in ("gflops", "decode_gflops", "prefill_gflops", "mix_ms") if k in result}
                c.rows = {k: result[k] for k in ("row_consistent", "row_max_diff", "row_detail") if k in result}
    if rc != -999:  # a timeout says the machine was busy, not that the library is bad
        _write_cache(key, {"accepted": c.accepted, "reason": c.reason, "build": c.build, "speed": c.speed,
                           "rows": c.rows})
    return _apply_rows(c)


def _apply_rows(c: Candidate) -> Candidate:
    """The row-consistency verdict on an accepted candidate (applied after the cache, so
    `$JUMPAHEAD_BLAS_ROWS` takes effect without a new probe)."""
    if c.accepted and c.rows:
        refuse, c.warnings = row_verdict(c.rows)
        if refuse:
            c.accepted, c.reason = False, refuse
    return c


def choose(examined: list[Candidate]) -> Candidate | None:
    """The user's library if accepted; else the fastest accepted one, where a later
    candidate displaces an earlier one only if clearly faster (the timings are noisy)."""
    accepted = [c for c in examined if c.accepted]
    for c in accepted:
        if c.origin == "JUMPAHEAD_BLAS":
            return c
    best: Candidate | None = None
    for c in accepted:
        if best is None:
            best = c
        elif c.speed.get("mix_ms") and best.speed.get("mix_ms") and c.speed["mix_ms"] * DISPLACE_MARGIN < best.speed["mix_ms"]:
            best = c
    return best


@dataclass
class BlasState:
    library: str = "reference (bundled)"
    path: str | None = None
    origin: str | None = None
    note: str = "not attempted"
    build: dict = field(default_factory=dict)
    speed: dict = field(default_factory=dict)
    threads: int | None = None
    max_threads: int | None = None
    warnings: list[str] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)
    considered: list[dict] = field(default_factory=list)
    choose_s: float = 0.0


_state = BlasState()
_handle: ctypes.CDLL | None = None


def _requested_threads() -> int | None:
    raw = os.environ.get("JUMPAHEAD_BLAS_THREADS") or os.environ.get("OPENBLAS_NUM_THREADS")
    try:
        return max(1, int(raw)) if raw else None
    except ValueError:
        return None


def _warn(message: str) -> None:
    _state.warnings.append(message)
    log.warning(message)
    print(f"jumpahead: warning: {message}", file=sys.stderr)


THREAD_TIMEOUT = "22"


def load_optimized_blas() -> str | None:
    """Choose a BLAS this CPU can run and bind it globally (Linux). Returns its path or None."""
    global _handle
    if _handle is not None or _state.note != "not attempted":
        return _state.path
    if sys.platform != "linux":
        _state.library, _state.note = "platform", "not needed on this platform (Accelerate/Metal)"
        return None
    if os.environ.get("JUMPAHEAD_BLAS") == "none":
        _state.note = "disabled by JUMPAHEAD_BLAS=none"
        return None
    started = time.perf_counter()
    if "mlx.core" in sys.modules:
        _warn("mlx was imported before jumpahead.engine; its reference BLAS may stay in use")
    threads = _requested_threads()
    features = cpu_features()
    examined = [examine(c, features, threads) for c in candidates()]
    _state.considered = [asdict(c) for c in examined]
    _state.rejected = [{"path": c.path, "origin": c.origin, "reason": c.reason} for c in examined if not c.accepted]
    for c in examined:
        if c.origin == "JUMPAHEAD_BLAS" and not c.accepted:
            _warn(f"JUMPAHEAD_BLAS={c.path} refused: {c.reason}")
    chosen = choose(examined)
    _state.choose_s = round(time.perf_counter() - started, 3)
    if chosen is None:
        why = "; ".join(f"{Path(r['path']).name} ({r['origin']}): {r['reason']}" for r in _state.rejected) or "none found"
        _state.note = "no optimized BLAS this CPU can run"
        _warn("falling back to MLX's reference BLAS (matmuls ~10-50x slower): " + why +
              ". Install your distribution's OpenBLAS (Debian/Ubuntu: apt-get install libopenblas0-pthread)"
              " and see `jumpahead doctor`.")
        return None
    # OpenBLAS reads this when it loads: its idle worker threads spin for 2^N cycles before
    # they sleep (N=28 by default, ~0.1 s). A spinning worker holds a core that the blocked
    # prefill attention's own threads need right after MLX's matmuls (engine/kv/
    # prefill_attention.py): a 2k-context layer's attention took 34 ms instead of 18 about
    # half the time, a 512-token chunk 1.49-1.64 s against 1.27-1.41 s with N=22 (~1.4 ms of
    # spinning). Decode measured the same either way (BENCHMARKS.md, issue 42). A user's
    # own setting wins.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)
    _handle = ctypes.CDLL(chosen.path, mode=ctypes.RTLD_GLOBAL)
    _state.library = Path(os.path.realpath(chosen.path)).name
    _state.path, _state.origin, _state.build, _state.speed = chosen.path, chosen.origin, chosen.build, chosen.speed
    _state.note = f"{chosen.origin}: {chosen.reason}"
    for message in chosen.warnings:  # in /health's and `doctor --json`'s blas.warnings; not on stderr at every start
        _state.warnings.append(f"{_state.library}: {message}")
        log.info("%s: %s", _state.library, message)
    _state.max_threads = chosen.build.get("max_threads")
    set_blas_threads(threads)
    return chosen.path


def _setter() -> Any:
    """The bound library's thread-count setter (OpenBLAS, BLIS), or None."""
    for name in ("openblas_set_num_threads", "bli_thread_set_num_threads"):
        fn = getattr(_handle, name, None) if _handle is not None else None
        if fn is not None:
            fn.argtypes = [ctypes.c_int] if name.startswith("openblas") else [ctypes.c_long]
            return fn
    return None


def threads_settable() -> bool:
    return _setter() is not None


def set_blas_threads(threads: int | None) -> int | None:
    """Set the bound library's thread count (None: all cores); warn where its build caps it."""
    if _handle is None:
        return None
    want = threads or os.cpu_count() or 1
    cap = _state.max_threads
    if cap and want > cap:
        _warn(f"{_state.library} is built with MAX_THREADS={cap}: BLAS uses {cap} of {want} threads")
        want = cap
    setter = _setter()
    if setter is not None:
        setter(want)
    _state.threads = want
    return want


_threads_held = threading.Lock()


@contextlib.contextmanager
def one_thread_each() -> Iterator[None]:
    """The bound library on one thread a call while held, for callers that run several
    BLAS calls at once from their own threads (engine/kv/prefill_attention.py): each
    call would otherwise start the library's own threads, more threads than cores. The
    setting is process-wide (the versions distributions ship have no per-call one), so
    it is held under a lock and the configured count restored after."""
    setter = _setter()
    if setter is None:
        yield
        return
    with _threads_held:
        setter(1)
        try:
            yield
        finally:
            setter(_state.threads or os.cpu_count() or 1)


def blas_info() -> dict:
    """What /health and `jumpahead doctor` report: the BLAS bound, why, and what was refused."""
    s = _state
    return {"library": s.library, "path": s.path, "origin": s.origin, "note": s.note,
            "config": s.build.get("config"), "core": s.build.get("corename"), "threads": s.threads,
            "max_threads": s.max_threads, "gflops": s.speed.get("gflops"), "rejected": s.rejected,
            "thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT") if s.path else None,
            "warnings": s.warnings}


def blas_details() -> BlasState:
    """Everything the choice saw (doctor prints it)."""
    return _state
