"""A workspace per task and the four tools an agent gets in it.

`TOOLS` are OpenAI function tools (the server shows them to the model in its own tool
format, Hermes `<tool_call>` for the default model). `run_tool(workspace, name,
arguments)` runs one call and returns the tool-result text; it never raises: a bad
call (unknown tool, missing argument, a path outside the workspace, text not found)
comes back as an `Error: ...` string the model reads and can recover from.

Results show what a call did, after Claude Code's tool results (Anthropic's agent; its
session in ../shared/traces/public/claude-code/): a write or an edit answers "The file X
has been created/updated." and the changed lines numbered as by `cat -n` (the edit with
SNIPPET_CONTEXT lines around it, at most SNIPPET_LINES, a long change its start and end),
so a wrong write is visible in its own result; `bash` answers with the command's output
(stdout then stderr) and, when it fails, its status, `(exit code N)` on the last line
(Claude Code states the code only for a failure; ground truth reads this line,
live/ground_truth.py); a command that prints nothing says "(no output)". Every task kind
gets these results (Task.snippets); `snippets=False` keeps the old bare "Wrote N lines to
X." / "Edited X." only to reproduce an adapter trained on it.

Confinement: file tools take paths relative to the workspace; absolute paths and paths
that leave it (`..`, symlinks pointing out) are refused. `bash` runs with the
workspace as its working directory, a timeout, an environment with nothing from the
caller's (no keys, no tokens, a fixed PATH and HOME=workspace), and without network
where the kernel allows an unprivileged network namespace (`unshare -rn`). It is a
guard against mistakes of a small model, not a security boundary against an attacker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "You are a coding agent. You work in a workspace folder and use the tools to change files "
    "or run commands. Say in one or two short sentences what you will do, then call one tool. "
    "When the task is done, give a short final answer without a tool call."
)

BASH_TIMEOUT_S = 10.0
MAX_RESULT_CHARS = 4000  # longer tool results are cut in the middle
MAX_FILE_BYTES = 1 << 20
SNIPPET_CONTEXT = 3  # lines shown before and after an edit's change
SNIPPET_LINES = 24  # at most this many lines in an edit or write result
SNIPPET_LINE_CHARS = 200


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


_STR = {"type": "string"}
TOOLS: list[dict[str, Any]] = [
    _tool("read_file", "Read a text file.", {"path": _STR}),
    _tool("write_file", "Write a text file (replaces it).", {"path": _STR, "content": _STR}),
    _tool("edit_file", "Replace the text old with new in a file.", {"path": _STR, "old": _STR, "new": _STR}),
    _tool("bash", "Run a shell command in the workspace.", {"command": _STR}),
]
TOOL_NAMES: tuple[str, ...] = tuple(t["function"]["name"] for t in TOOLS)


@contextmanager
def workspace(prefix: str = "jumpahead-task-") -> Iterator[Path]:
    """A fresh empty temporary folder, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class ToolError(Exception):
    """A call the model got wrong; its message is the tool result."""


def resolve(workspace: Path, path: Any) -> Path:
    """`path` inside `workspace`, or ToolError (absolute, escaping, not a string)."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string")
    if path.startswith(("/", "~")) or os.path.isabs(path):
        raise ToolError(f"path {path!r} is absolute; use a path relative to the workspace")
    root = Path(workspace).resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"path {path!r} is outside the workspace")
    return target


def _text(arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} is required and must be a string")
    return value


def _read(ws: Path, arguments: dict[str, Any]) -> str:
    target = resolve(ws, arguments.get("path"))
    if not target.is_file():
        raise ToolError(f"{arguments['path']} does not exist" if not target.exists()
                        else f"{arguments['path']} is not a file")
    if target.stat().st_size > MAX_FILE_BYTES:
        raise ToolError(f"{arguments['path']} is too large to read")
    return target.read_text(errors="replace")


def _write(ws: Path, arguments: dict[str, Any], snippets: bool = True) -> str:
    target = resolve(ws, arguments.get("path"))
    content = _text(arguments, "content")
    if target.is_dir():
        raise ToolError(f"{arguments['path']} is a folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    existed = target.exists()
    target.write_text(content)
    lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
    if not snippets:
        return f"Wrote {lines} line{'s' if lines != 1 else ''} to {arguments['path']}."
    head = (f"The file {arguments['path']} has been {'overwritten' if existed else 'created'} "
            f"({lines} line{'s' if lines != 1 else ''}).")
    more = f"\n[{lines - SNIPPET_LINES} more lines]" if lines > SNIPPET_LINES else ""
    return head + snippet(content, 0, SNIPPET_LINES - 1, arguments["path"]) + more


def _edit(ws: Path, arguments: dict[str, Any], snippets: bool = True) -> str:
    target = resolve(ws, arguments.get("path"))
    old, new = _text(arguments, "old"), _text(arguments, "new")
    if not target.is_file():
        raise ToolError(f"{arguments['path']} does not exist")
    text = target.read_text(errors="replace")
    if not old:
        raise ToolError("old must not be empty")
    count = text.count(old)
    if count == 0:
        raise ToolError(f"old text not found in {arguments['path']}")
    if count > 1:
        raise ToolError(f"old text occurs {count} times in {arguments['path']}; give more of it")
    at = text.index(old)
    after = text.replace(old, new, 1)
    target.write_text(after)
    if not snippets:
        return f"Edited {arguments['path']}."
    first = after.count("\n", 0, at)
    last = first + new.count("\n") - (1 if new.endswith("\n") and new else 0)
    head = f"The file {arguments['path']} has been updated."
    return head + snippet(after, first - SNIPPET_CONTEXT, last + SNIPPET_CONTEXT, arguments["path"])


def snippet(text: str, first: int, last: int, path: str) -> str:
    """`cat -n` of lines first..last (0-based, clamped) of `text`, at most SNIPPET_LINES
    of them (a long change shows its start and end), each cut to SNIPPET_LINE_CHARS."""
    if not text:
        return " It is empty."
    lines = text.removesuffix("\n").split("\n")
    first, last = max(first, 0), min(last, len(lines) - 1)
    if last < first:
        return " It is empty."
    numbered = [f"{i + 1:6}\t{lines[i][:SNIPPET_LINE_CHARS]}" for i in range(first, last + 1)]
    if len(numbered) > SNIPPET_LINES:
        half = SNIPPET_LINES // 2
        numbered = [*numbered[:half], f"[... {len(numbered) - 2 * half} lines ...]", *numbered[-half:]]
    return f" Here's the result of running `cat -n` on a snippet of {path}:\n" + "\n".join(numbered)


@lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
    """`unshare -rn` where an unprivileged network namespace works here, else nothing."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        ok = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (exe, "-rn") if ok else ()


def network_isolated() -> bool:
    """Whether bash commands run without network."""
    return bool(_netns_prefix())


def _clean_env(ws: Path) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(ws), "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb"}


def _bash(ws: Path, arguments: dict[str, Any], timeout: float = BASH_TIMEOUT_S) -> str:
    command = _text(arguments, "command")
    if not command.strip():
        raise ToolError("command must not be empty")
    bash = shutil.which("bash") or "/bin/bash"
    argv = [*_netns_prefix(), bash, "--noprofile", "--norc", "-c", command]
    try:
        res = subprocess.run(argv, cwd=ws, env=_clean_env(ws), capture_output=True, text=True,
                             errors="replace", timeout=timeout, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    except subprocess.TimeoutExpired:
        raise ToolError(f"command timed out after {timeout:g} s") from None
    # the workspace's temporary path is noise that differs per run: the same command in two
    # runs (two arms on one seed) must give the same result
    out = res.stdout + res.stderr
    for root in sorted({str(ws), str(Path(ws).resolve())}, key=len, reverse=True):
        out = out.replace(f"{root}/", "").replace(root, ".")
    if res.returncode != 0:
        out += f"\n(exit code {res.returncode})" if out else f"(exit code {res.returncode})"
    return out if out else "(no output)"


_HANDLERS = {"read_file": _read, "write_file": _write, "edit_file": _edit, "bash": _bash}


def _clip(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def run_tool(workspace: Path, name: str, arguments: dict, snippets: bool = True) -> str:
    """Run one tool call in `workspace`; the result text (errors as `Error: ...`);
    `snippets`: writes and edits show the changed lines (module docstring)."""
    handler = _HANDLERS.get(name)
    if handler is None:
        return f"Error: unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}"
    if not isinstance(arguments, dict):
        return "Error: arguments must be a JSON object"
    try:
        if handler in (_write, _edit):
            return _clip(handler(Path(workspace), arguments, snippets))
        return _clip(handler(Path(workspace), arguments))
    except ToolError as exc:
        return f"Error: {exc}"
    except (OSError, UnicodeError, ValueError) as exc:
        return f"Error: {type(exc).__name__}: {exc}"
