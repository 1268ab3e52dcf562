"""The BLAS choice on CPUs this machine is not: qemu-user emulates a CPU without AVX-512
(Haswell: AVX2 + FMA, like the Zen 1 EPYC the review used) and one without AVX2
(SandyBridge), on any CI machine. The cmeel-openblas wheel (SKYLAKEX only) must be
refused there, and what is chosen must compute right, the default model included.

Each emulated process reads its CPU by CPUID (numpy), so it sees the emulated CPU; the
probe children run under the same emulator ($JUMPAHEAD_BLAS_PROBE_WRAPPER), since
qemu-user does not follow exec.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

QEMU = shutil.which("qemu-x86_64")
pytestmark = [
    pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                       reason="qemu-x86_64 emulates x86-64 CPUs: this guard runs on x86-64 Linux"),
    pytest.mark.skipif(QEMU is None, reason="qemu-user is not installed (apt-get install qemu-user; "
                                            "scripts/install.sh --test does): the emulated-CPU guard cannot run"),
]

WHEELS = sorted(glob.glob(os.path.join(sysconfig.get_paths()["platlib"], "cmeel.prefix", "lib", "libopenblas.so.0")))
REPO = Path(__file__).resolve().parents[1]

CHOICE = """
import json, jumpahead.engine
from jumpahead.engine.machine import blas
import mlx.core as mx, numpy as np
a = np.random.default_rng(0).standard_normal((96, 200)).astype(np.float32)
b = np.random.default_rng(1).standard_normal((200, 70)).astype(np.float32)
err = float(np.abs(np.array(mx.array(a) @ mx.array(b)) - a.astype(np.float64) @ b).max())
print(json.dumps({"features": sorted(blas.cpu_features()), "info": blas.blas_info(),
                  "considered": blas.blas_details().considered, "matmul_err": err}))
"""


def emulated(cpu: str, code: str, tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "JUMPAHEAD_BLAS_PROBE_WRAPPER": f"{QEMU} -cpu {cpu}",
           "JUMPAHEAD_BLAS_CACHE": str(tmp_path / f"blas-{cpu}.json")}
    return subprocess.run([QEMU, "-cpu", cpu, sys.executable, "-u", "-c", code], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=tmp_path)


@pytest.mark.parametrize("cpu, lacks", [("Haswell", "AVX512F"), ("SandyBridge", "AVX2")])
def test_emulated_cpu_refuses_the_avx512_wheel_and_computes_right(cpu, lacks, tmp_path):
    done = emulated(cpu, CHOICE, tmp_path)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-2000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert lacks not in out["features"] and "AVX512F" not in out["features"], "the emulated CPU must be seen as it is"
    info = out["info"]
    for c in out["considered"]:
        if c["origin"] == "wheel cmeel-openblas" and "SKYLAKEX" in str(c["build"].get("config")):
            assert not c["accepted"], c
            assert "SKYLAKEX" in c["reason"] and "AVX512F" in c["reason"], c["reason"]
            assert info["path"] != c["path"]
    if info["path"] is None:
        assert info["warnings"], "the reference fallback must be loud"
    assert out["matmul_err"] < 1e-3


@pytest.mark.skipif(not WHEELS, reason="the cmeel-openblas wheel is not installed: nothing to crash")
def test_the_probe_itself_catches_the_crash(tmp_path, monkeypatch):
    """The safety net under the static check: the wheel's GEMM, run on the emulated
    Haswell, dies with SIGILL in the child, and the verdict says so (the server lives)."""
    from jumpahead.engine.machine import blas

    monkeypatch.setenv("JUMPAHEAD_BLAS_PROBE_WRAPPER", f"{QEMU} -cpu Haswell")
    rc, lines, err = blas._run_probe("check", WHEELS[0], None)
    assert lines and lines[0]["stage"] == "info" and lines[0]["corename"] == "SKYLAKEX"
    assert rc != 0 and "SIGILL" in blas._exit_reason(rc, err), (rc, err[-300:])


FORWARD = """
import json, jumpahead.engine
from jumpahead.engine.machine import blas
from jumpahead.engine.model.loader import load_model
import mlx.core as mx
model, tok, info = load_model(None, progress=lambda s: None)
ids = tok.encode("def add(a, b):")
logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
top = mx.argsort(-logits)[:5].tolist()
print(json.dumps({"blas": blas.blas_info()["path"], "top": top, "logits": [float(logits[t]) for t in top]}))
"""


@pytest.mark.slow  # importing torch and transformers (mlx-lm's loader) under emulation takes minutes
def test_default_model_forward_on_a_cpu_without_avx512(tmp_path, loaded_model):
    """The default model's forward under the emulated Haswell, with the BLAS chosen
    there, matches the forward here: the same top tokens, logits within float32 noise."""
    import mlx.core as mx

    done = emulated("Haswell", FORWARD, tmp_path, timeout=900)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-2000:]}"
    there = json.loads(done.stdout.strip().splitlines()[-1])
    assert there["blas"] not in WHEELS
    model, tok, _ = loaded_model
    logits = model(mx.array([tok.encode("def add(a, b):")]))[0, -1].astype(mx.float32)
    here = [float(logits[t]) for t in there["top"]]
    assert max(abs(a - b) for a, b in zip(here, there["logits"])) < 1e-2
    assert int(mx.argmax(logits).item()) == there["top"][0]
