"""`jumpahead bench roofline` (bench/roofline.py) on its cheapest configuration: the tiny
random-weight llama, one row at a 64-token context, a few steps, small read tests. What
is checked is the report's structure and that its parts add up, not the speeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jumpahead.bench import command
from jumpahead.bench.roofline import main
from jumpahead.engine import memory
from jumpahead.engine.kv import host_decode, row_gemv
from jumpahead.engine.machine.cblas import bound_cblas


@pytest.mark.parametrize("gemv,host,rows", [("off", "off", 1), ("on", "off", 1), ("on", "on", 1), ("on", "on", 2)])
def test_roofline_report_adds_up(gemv: str, host: str, rows: int, tiny_model_dir: Path, tmp_path: Path,
                                 monkeypatch) -> None:
    """Every way a decode row is run (MLX's matmul, the sgemv stand-ins of
    engine/kv/row_gemv.py, the host step of engine/kv/host_decode.py): the split times the
    path the engine runs, and every layer's bytes, the head's among them, count once."""
    if gemv == "on" and bound_cblas() is None:
        pytest.skip("no optimized BLAS bound: no sgemv path")
    monkeypatch.setenv(row_gemv.ENV, gemv)
    monkeypatch.setenv(host_decode.ENV, host)
    out = tmp_path / "roofline.json"
    assert main(["--model", str(tiny_model_dir), "--contexts", "64", "--rows", str(rows), "--steps", "3",
                 "--repeats", "1", "--stream-mb", "16", "--matrices", "4", "--tokens", "6", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["bench"] == "roofline" and "roofline" in command.KINDS

    machine = result["machine"]
    stream = machine["stream"]
    assert stream["stream_read_gb_s"] > 0 and stream["numpy_sum_gb_s"] > 0
    assert stream["stream_read_gb_s"] == stream[stream["stream_read_source"]]
    blas = machine["blas"]
    assert blas["mlx_sgemm_prefill_gflop_s"] > 0
    assert set(blas["mlx_decode_read_gb_s"]) == {"m1", "m4", f"m{rows}"} and min(blas["mlx_decode_read_gb_s"].values()) > 0
    dispatch = machine["dispatch"]
    assert dispatch["chain_nodes"] >= 1000 and dispatch["eval_us_per_node"] > 0 and dispatch["build_us_per_node"] > 0

    shape = result["model_shape"]
    assert shape["linear_layers"] > 0 and shape["weight_bytes"] > shape["head_bytes"] > 0

    (run,) = result["runs"]
    assert (run["rows"], run["context"]) == (rows, 64)
    step, split, nodes = run["step"], run["split"], run["nodes"]
    for value in (step["total_ms"], step["forward_ms"], step["eval_ms"], step["graph_build_ms"], step["sampler_ms"],
                  split["weights_ms"], split["attention_ms"], split["graph_build_ms"]):
        assert value >= 0
    assert abs(step["forward_ms"] + step["eval_ms"] - step["total_ms"]) <= 0.01
    parts = split["weights_ms"] + split["attention_ms"] + split["graph_build_ms"] + split["other_ops_and_dispatch_ms"]
    assert abs(parts - step["total_ms"]) <= 0.01, (parts, step)
    assert split["graph_build_ms"] == step["graph_build_ms"]
    assert nodes["per_step"] > 0 and sum(nodes["top_primitives"].values()) <= nodes["per_step"]
    assert split["attention_layers"] == shape["layers"] and split["weight_bytes"] == shape["weight_bytes"]
    assert sum(g["layers"] for g in split["weights_by_shape"].values()) == split["linear_layers"]
    assert any(name.startswith("head ") for name in split["weights_by_shape"])
    linear = "sgemv" if rows == 1 else "sgemm"  # rows share each weight's read through sgemm
    assert split["weights_path"] == (f"numpy and {linear} outside MLX's graph (engine/kv/host_decode.py)" if host == "on"
                                     else "sgemv (engine/kv/row_gemv.py)" if gemv == "on" else "mlx matmul")
    if host == "on":  # the same steps through MLX's graph, interleaved; the host step's own split
        ab = run["host_decode"]
        assert ab["step_ms"] > 0 and ab["mlx_step_ms"] > 0
        assert abs(ab["speedup"] - ab["mlx_step_ms"] / ab["step_ms"]) <= 0.01
        parts = ab["split_ms"]
        assert min(parts.values()) >= 0 and parts["weights"] > 0 and parts["attention"] > 0  # means, not medians
        # the served step's split is the host step's own; it builds no graph
        assert (split["weights_ms"], split["attention_ms"]) == (parts["weights"], parts["attention"])
        assert split["graph_build_ms"] == 0 and split["mlx_parts"]["graph_build_ms"] > 0
    else:
        assert run["host_decode"] is None and split["mlx_parts"] is None
    if gemv == "on" and rows == 1:  # the same steps on MLX's matmul, interleaved
        ab = run["row_gemv"]
        assert ab["step_ms"] > 0 and ab["matmul_step_ms"] > 0
        assert abs(ab["speedup"] - ab["matmul_step_ms"] / ab["step_ms"]) <= 0.01
    else:
        assert run["row_gemv"] is None
    floors = run["floors"]
    assert 0 < floors["bandwidth_floor_ms"] and floors["kv_bytes"] == rows * 64 * shape["kv_bytes_per_token"]
    pre = run["prefill"]
    assert pre["chunk_tokens"] == 64 and pre["tok_s"] > 0
    # the FLOPs a causal chunk needs, counted here apart: at context 64 the only chunk starts
    # at 0, so query i sees i + 1 keys (64 * 65 / 2 in all), not 64 each
    hq, _, d = split["attention_heads"]
    assert pre["chunk_start"] == 0
    attention = 4 * rows * hq * d * split["attention_layers"] * (64 * 65 // 2)
    flop = 2 * shape["prefill_linear_params"] * 64 * rows + attention
    assert abs(pre["attention_gflop"] - attention / 1e9) <= 1e-3 and abs(pre["gflop"] - flop / 1e9) <= 1e-3
    # three timings (the fill's and two reruns), the median reported, each against the rate after it
    samples, rates = pre["chunk_ms_samples"], pre["sgemm_gflop_s_after_each"]
    assert len(samples) == len(rates) == 3 and min(rates) > 0
    assert pre["chunk_ms"] == sorted(samples)[1]
    paired = sorted(flop / (r * 1e9) / (c / 1e3) for r, c in zip(rates, samples))[1]
    assert abs(pre["fraction_of_sgemm_limit_paired"] - paired) <= 0.01 * paired + 1e-3
    # B=1: the chunk again, rolled back, with numpy's swiglu and the buffer cache held off, interleaved
    host = run["prefill"]["host_paths"]
    if rows > 1:
        assert host is None
    else:
        assert host["chunk_ms"] > 0 and host["held_off_chunk_ms"] > 0 and host["swiglu"] is True
        assert abs(host["speedup"] - host["held_off_chunk_ms"] / host["chunk_ms"]) <= 0.01
        assert host["buffer_cache_mb"] == round(memory.buffer_cache_limit() / 2**20, 1) > 32
        floor = run["prefill"]["sgemm_floor_ms"]
        assert abs(host["held_off_fraction_of_sgemm_limit"] - floor / host["held_off_chunk_ms"]) <= 0.01

    served = result["served"]
    assert served["tok_s"] > 0
    if rows == 1:  # the served rate beside the B=1 step's
        assert served["split_context"] == 64 and served["split_tok_s"] > 0
