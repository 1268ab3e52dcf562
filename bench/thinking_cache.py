"""Prefix reuse across a multi-turn Anthropic session with thinking, through the SDK.

An agent resends the whole history each turn. When the thinking blocks it got back
carry a valid signature it keeps them, the server renders them back into the prompt
(under a template that shows earlier reasoning, as Qwen3's does inside a tool loop),
and the next prompt extends the previous prompt plus its answer: the prefix cache
serves all of it. Without a valid signature the thinking is dropped and the prompt
departs from the cached one where the earlier answer began.

`session(url, turns, signed=...)` runs the session with the official anthropic SDK
against a server in script mode and returns the cached and total prompt tokens per
turn. `python -m jumpahead.bench.thinking_cache` runs both arms on the default
model (its template given reasoning, in a temporary folder) and prints a table.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jumpahead.core.script import ScriptedCall, ScriptTurn

TOOL = {"name": "read", "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
TURNS = [
    ScriptTurn(reasoning="The user wants the bug fixed. First read main.py to see the failing function.",
               text="Reading main.py.", tool_calls=[ScriptedCall("read", {"path": "main.py"})]),
    ScriptTurn(reasoning="main.py calls parse() from util.py; the off-by-one must be there. Read util.py next.",
               text="Reading util.py.", tool_calls=[ScriptedCall("read", {"path": "util.py"})]),
    ScriptTurn(reasoning="parse() slices [1:] and drops the first field. That is the bug; explain the fix.",
               text="The bug is the [1:] slice in parse(); use the whole list."),
]
RESULTS = ["def main():\n    print(parse('a,b,c'))\n", "def parse(s):\n    return s.split(',')[1:]\n"]

# The default template, with reasoning rendered back as Qwen3 renders it inside a tool loop.
REASONING_SNIPPET = ("{{- '<|im_start|>assistant\\n' -}}{%- if message.reasoning_content -%}"
                     "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}{%- endif -%}"
                     "{{- content -}}")


def reasoning_template_folder(model_folder: Path, into: Path) -> Path:
    """A copy of an mlx-lm model folder (weights linked) whose template shows reasoning."""
    into.mkdir(parents=True, exist_ok=True)
    for item in model_folder.iterdir():
        if item.name != "tokenizer_config.json" and not (into / item.name).exists():
            (into / item.name).symlink_to(item.resolve())
    config = json.loads((model_folder / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    old = "{{- '<|im_start|>assistant\\n' + content -}}"
    if old not in template:
        raise ValueError("the template's assistant line is not the expected one")
    config["chat_template"] = template.replace(old, REASONING_SNIPPET)
    (into / "tokenizer_config.json").write_text(json.dumps(config))
    return into


def session(url: str, turns: list[ScriptTurn], *, signed: bool = True) -> list[dict[str, int]]:
    """Run the turns as one agent session; per turn: prompt tokens, cached tokens, and
    thinking characters the client sent back."""
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=600)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in main.py."}]
    rows = []
    for n, _ in enumerate(turns):
        with client.messages.stream(model="m", max_tokens=400, messages=messages, tools=[TOOL],
                                    thinking={"type": "enabled", "budget_tokens": 200}) as stream:
            message = stream.get_final_message()
        usage = message.usage
        sent_back = sum(len(m["thinking"]) for msg in messages if msg["role"] == "assistant"
                        for m in msg["content"] if m.get("type") == "thinking")
        rows.append({"turn": n + 1, "prompt": usage.input_tokens + (usage.cache_read_input_tokens or 0),
                     "cached": usage.cache_read_input_tokens or 0, "thinking_chars_sent": sent_back})
        content = [block.model_dump(exclude_none=True) for block in message.content]
        for block in content:
            if block["type"] == "thinking" and not signed:
                block["signature"] = "not-this-server"  # e.g. a client that rewrote it
        messages.append({"role": "assistant", "content": content})
        calls = [b for b in content if b["type"] == "tool_use"]
        if calls:
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c["id"], "content": RESULTS[min(n, len(RESULTS) - 1)]}
                for c in calls]})
        else:
            messages.append({"role": "user", "content": "Thanks. Anything else?"})
    return rows


def main(argv: list[str] | None = None) -> int:
    import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from jumpahead.engine.model.default_model import ensure_default_model
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    from jumpahead.core.script import Script
    from jumpahead.proxy.server import create_app

    from jumpahead.live.server_process import serve_app

    model, _, info = load_model(None, progress=lambda s: print(s, file=sys.stderr))
    tmp = Path(tempfile.mkdtemp(prefix="jumpahead-thinking-"))
    try:
        folder = reasoning_template_folder(Path(ensure_default_model(progress=lambda _: None)), tmp / "model")
        tokenizer = load_tokenizer(folder)
        print(f"{'arm':<10}{'turn':>5}{'prompt':>8}{'cached':>8}{'share':>8}")
        for signed in (True, False):
            engine = Engine(model, tokenizer, info, EngineConfig(max_batch=2, max_asserted=1024,
                                                                 prefix_cache_dir=str(tmp / f"pc{signed}")))
            try:
                with serve_app(create_app(engine, script=Script(list(TURNS)))) as url:
                    rows = session(url, TURNS, signed=signed)
            finally:
                engine.close()
            for row in rows:
                print(f"{'signed' if signed else 'unsigned':<10}{row['turn']:>5}{row['prompt']:>8}{row['cached']:>8}"
                      f"{row['cached'] / max(row['prompt'], 1):>8.1%}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
