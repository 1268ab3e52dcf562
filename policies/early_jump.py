"""Earlier action selection (`early-jump`): the whole next tool call, proposed at the
reasoning boundary, before the model opens it (docs/design.md, logical jump-ahead).

The online jump (policies/jump.py `jump`) waits until the model has opened a call and
fixed its destination. This arm decides the call one step earlier, from what the
turn's output has settled when its reasoning ends:

- models with a reasoning block: at `reasoning_closed`, from the reasoning;
- models whose reasoning is plain text before the call (the default model with the
  live adapter, live/trajectories.py: the text states the content in a fenced block
  whose lead names its file, then makes one call): at `block_closed`, when a fenced
  block of the visible text has closed and no call is open (policies/tracker.py).

The last block stated decides the call (jump_sources.py reads the blocks and their
leads; jump_plan.py the tools' argument roles and the edit rule):

1. a block whose lead names a file (and no edit wording: "In a.py I replace"): a write
   of that file with the block as its content, if it is the one block stated for that
   path (`blocks_for_path`);
2. a block after an old block whose lead names a file: the edit of that file, if the
   old text is in the context and the pair is the one edit stated for it (`edit_pair`);
3. a fenced block with a shell info string (`bash`, `sh`, ...), or none after a lead
   that says it runs something: the shell call of that command, if it is the one
   command stated.

The request must offer exactly one tool of that role (by its schema, `roles`), and
the arguments must cover its required ones. Anything ambiguous gives no proposal. The
call is the family's writer's (engine/strict/tool_formats/: start marker, name, arguments, end
marker), after the whitespace the chat template puts between text and a call (read off
the template once per tokenizer; a template that writes no text before a call, such as
harmony's or Llama 3's, gives no proposal at `block_closed`).

Options: `verify=1` proposes the call for verification (the model checks it token by
token like echo: exact); the default asserts it (kind `jump`, appended unsampled).
Interventions are kind `jump` either way, their label starts with `early`, and the
intervention records name the policy `early-jump`, so D, P and H are accounted once,
with the other jumps' (traces/accounting.py).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from jumpahead.engine.strict.tool_formats import family_of
from jumpahead.engine.strict.tool_formats.base import PartialCall

from .api import BoundaryEvent, Intervention, RequestContext, flag_option
from .jump import _JumpPolicy
from .jump_plan import JumpPlan, Roles, ToolSpec, edit_pair, roles
from .jump_sources import Block, blocks_for_path, blocks_in, lead_path

# the lead of an old block: the file is named, but what follows is an edit's old text
_EDIT_WORDS = re.compile(r"(?i)\b(?:replac\w*|chang\w*|substitut\w*|swap\w*)\b")
_SHELL_INFO = frozenset({"bash", "sh", "shell", "console", "zsh", "terminal", "shell-session"})
_RUN_WORDS = re.compile(r"(?i)\b(?:run|runs|running|execute|executes|command)\b")
_PROBE_TEXT, _PROBE_REASONING = "PROBE TEXT 7f3a.", "PROBE REASONING 7f3a."
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "probe", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}
_AFTER_REASONING = "\n\n"  # where the template does not show it: `</think>\n\n<tool_call>` (Qwen3's layout)


def _strip_nl(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


# --- the chat template's whitespace before a call -------------------------------------------

_SEPARATORS: dict[int, tuple[Any, str | None, str]] = {}
_SEP_LOCK = threading.Lock()


def _between(text: str, probe: str, after: str | None, start: str) -> str | None:
    """The text between `after` (the first one following `probe`; `probe` itself where
    None) and the call's start marker following it; None where either is missing."""
    i = text.find(probe)
    if i < 0:
        return None
    i += len(probe)
    if after is not None:
        j = text.find(after, i)
        if j < 0:
            return None
        i = j + len(after)
    k = text.find(start, i)
    return text[i:k] if k >= 0 else None


def separators(tokenizer: Any, family: Any, think_end: str) -> tuple[str | None, str]:
    """(between visible text and a call, between the end of reasoning and a call), as
    the tokenizer's chat template writes an assistant message (cached per tokenizer).
    The first is None where the template writes no text before a call (drops it, or
    puts it in another message); the second falls back to `_AFTER_REASONING` where the
    template does not show reasoning."""
    with _SEP_LOCK:
        hit = _SEPARATORS.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1], hit[2]
    call = {"id": "call_000000001", "type": "function", "function": {"name": "probe", "arguments": {"a": "b"}}}

    def render(message: dict[str, Any]) -> str:
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}, message], tools=[_PROBE_TOOL],
                                                 tokenize=False)
        except Exception:  # a template that wants other shapes: no text before its calls
            return ""
        return text if isinstance(text, str) else ""

    text_sep = _between(render({"role": "assistant", "content": _PROBE_TEXT, "tool_calls": [call]}),
                        _PROBE_TEXT, None, family.start)
    if text_sep is not None and text_sep.strip():
        text_sep = None  # markers between: the text and the call are not one message's
    reasoning_sep = _between(render({"role": "assistant", "content": "", "reasoning_content": _PROBE_REASONING,
                                     "tool_calls": [call]}), _PROBE_REASONING, think_end, family.start)
    if reasoning_sep is None or reasoning_sep.strip():
        reasoning_sep = _AFTER_REASONING
    with _SEP_LOCK:
        _SEPARATORS[id(tokenizer)] = (tokenizer, text_sep, reasoning_sep)
    return text_sep, reasoning_sep


# --- the policy -------------------------------------------------------------------------------


class EarlyJump(_JumpPolicy):
    """Proposes the whole next call at the reasoning boundary (see the module doc)."""

    name = "early-jump"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.verify = flag_option(options, "verify", "early-jump")
        self.tokenizer: Any = None
        self.writer: Any = None  # the request's ToolFamily (Hermes too): writes the whole call
        self.think_end = "</think>"
        self.one_call = False  # parallel_tool_calls false: no call after the first

    def configure(self, ctx: RequestContext) -> None:
        super().configure(ctx)
        tok = ctx.tokenizer
        self.tokenizer = tok
        writer = family_of(tok)
        # the parser reads this tokenizer's own markers: write only where they are the family's
        self.writer = writer if (self.start, self.end) == (writer.start, writer.end) else None
        if getattr(tok, "has_thinking", False) and getattr(tok, "think_end", None):
            self.think_end = tok.think_end
        choice = ctx.turn.tool_choice
        if choice.mode == "none":
            self.tools = {}
        elif choice.mode == "function" and choice.name:
            self.tools = {k: v for k, v in self.tools.items() if k == choice.name}
        self.one_call = ctx.turn.parallel_tool_calls is False

    # only the reasoning boundary: inside a call the model has chosen already
    def on_reasoning_closed(self, event: BoundaryEvent) -> Intervention | None:
        return self.decide(event)

    def on_block_closed(self, event: BoundaryEvent) -> Intervention | None:
        return self.decide(event)

    def on_tool_name(self, event: BoundaryEvent) -> Intervention | None:
        return None

    def on_argument_key(self, event: BoundaryEvent) -> Intervention | None:
        return None

    # --- the plan ---------------------------------------------------------------------------
    def plan(self, event: BoundaryEvent) -> JumpPlan | None:
        if not self.tools or self.writer is None or event.call_text:
            return None
        if event.calls_done and (self.one_call or not self.end):
            return None
        out = event.output_text
        base = 0
        if event.calls_done:  # what an earlier call of this turn took is settled already
            base = out.rfind(self.end)
            if base < 0:
                return None
            base += len(self.end)
        if event.boundary == "reasoning_closed":
            anchor = out.rfind(self.think_end)
            if anchor < base:
                return None
            anchor += len(self.think_end)
            sep: str | None = separators(self.tokenizer, self.writer, self.think_end)[1]
            blocks = blocks_in(out[base:anchor])
            if not blocks:
                return None
        elif event.boundary == "block_closed":
            sep = separators(self.tokenizer, self.writer, self.think_end)[0]
            blocks = blocks_in(out[base:])
            if sep is None or not blocks or blocks[-1].kind != "fence":
                return None
            last = blocks[-1]
            nl = out.find("\n", base + last.end)
            anchor = base + last.end + len(out[base + last.end : nl if nl >= 0 else len(out)].rstrip())
        else:
            return None
        written = out[anchor:]
        if written.strip() or not blocks[-1].closed:
            return None  # the model went on past the boundary, or the block never closed
        decided = self._call(event, blocks, base)
        if decided is None:
            return None
        name, r, args, source, where, label, keys = decided
        lead = sep[len(written):] if sep.startswith(written) else ""
        text = lead + self.writer.write([(name, args)])
        if event.budget and len(self.tokenizer.encode(text, add_special_tokens=False)) > event.budget:
            return None  # the call would be cut: a broken call is no action
        return JumpPlan(None, None, [], r, source, where, f"early {label}", keys, fixed_text=text)

    def _call(self, event: BoundaryEvent, blocks: list[Block], base: int
              ) -> tuple[str, Roles, dict[str, Any], tuple[int, int], str, str, list[str]] | None:
        """(tool, roles, arguments, source span, where, label, content keys) of the call
        the last block decides, or None."""
        last = blocks[-1]
        path = lead_path(last.lead)
        span = (base + last.start, base + last.end)
        if path is not None:
            if _EDIT_WORDS.search(last.lead):
                return None  # the old half of an edit: its new half decides
            found = blocks_for_path(blocks, path)
            if found.block is None or found.block.text != last.text:
                return None
            tool = self._tool("write")
            if tool is None:
                return None
            name, r, fixed = tool
            assert r.path_key and r.content_key
            args = self._arguments(name, {**fixed, r.path_key: path, r.content_key: last.text})
            return (name, r, args, span, "output", f"{name} path={path} content from output block [{span[0]}:{span[1]}]",
                    [r.content_key]) if args else None
        if len(blocks) >= 2 and (old_path := lead_path(blocks[-2].lead)) is not None:
            scope = event.output_text[base:]
            pair = edit_pair(scope, old_path, self.index(event.context_text))
            if pair is None or pair[1] != _strip_nl(last.text):
                return None
            tool = self._tool("edit")
            if tool is None:
                return None
            name, r, fixed = tool
            assert r.path_key and r.old_key and r.new_key
            old, new, account, old_span = pair
            args = self._arguments(name, {**fixed, r.path_key: old_path, r.old_key: old, r.new_key: new})
            return (name, r, args, old_span, "context", f"{name} path={old_path} {account}",
                    [r.new_key, r.old_key]) if args else None
        commands = {_strip_nl(b.text) for b in blocks if b.closed and self._shell_block(event.output_text, base, b)}
        if not self._shell_block(event.output_text, base, last) or len(commands) != 1:
            return None
        command = next(iter(commands))
        tool = self._tool("shell")
        if not command.strip() or tool is None:
            return None
        name, r, fixed = tool
        assert r.command_key
        args = self._arguments(name, {**fixed, r.command_key: command})
        return (name, r, args, span, "output", f"{name} command from output block [{span[0]}:{span[1]}]",
                [r.command_key]) if args else None

    @staticmethod
    def _shell_block(out: str, base: int, block: Block) -> bool:
        """A fenced block stating a command: a shell info string, or none after a lead that
        says it runs something (and names no file)."""
        if block.kind != "fence" or lead_path(block.lead) is not None:
            return False
        start = base + block.start
        opener = out[out.rfind("\n", 0, max(0, start - 1)) + 1 : max(0, start - 1)].strip().lstrip("`~").split()
        info = opener[0].lower() if opener else ""
        if info:
            return info in _SHELL_INFO
        return _RUN_WORDS.search(block.lead[-120:]) is not None

    def _tool(self, kind: str) -> tuple[str, Roles, dict[str, Any]] | None:
        """The one offered tool of role `kind` (write | edit | shell) whose schema has the
        role's arguments, with the arguments that select the role (str_replace_editor's
        command); None where none or several fit."""
        found = []
        for name, spec in self.tools.items():
            fixed: dict[str, Any] = {}
            if name == "str_replace_editor":
                if kind not in ("write", "edit"):
                    continue
                fixed = {"command": "create" if kind == "write" else "str_replace"}
            r = roles(name, spec, PartialCall(name, dict(fixed)))
            keys = {"write": (r.path_key, r.content_key), "edit": (r.path_key, r.old_key, r.new_key),
                    "shell": (r.command_key,)}[kind]
            if r.kind != kind or not all(keys):
                continue
            if spec.properties and any(k not in spec.properties for k in keys):
                continue
            found.append((name, r, fixed))
        return found[0] if len(found) == 1 else None

    def _arguments(self, name: str, wanted: dict[str, Any]) -> dict[str, Any] | None:
        """`wanted` in the tool's schema order; None where a required argument is missing."""
        spec = self.tools.get(name) or ToolSpec(name)
        if spec.required - set(wanted):
            return None
        order = {k: i for i, k in enumerate(spec.properties)}
        return dict(sorted(wanted.items(), key=lambda kv: order.get(kv[0], len(order))))
