"""Deciding what a jump supplies: the rest of a tool call, built from content the context
already holds (docs/design.md, logical jump-ahead).

`plan_online` looks at the call the model is writing (the family's partial-call reader,
engine/strict/tool_formats/<family>.py; Hermes' `parse_partial` by default) and, once
its destination is fixed (a file tool's path complete; for other tools a first argument
or a command prefix), finds the complete literal content of the remaining arguments:

1. write tools: the one block this turn's reasoning/text stated for that path;
2. edit tools: an old block shown in a tool result (the file as read) and a new block
   stated after it in this turn's output;
3. any tool: one earlier call (in the context or earlier this turn) that agrees with
   everything written so far (a repeated call);
4. write tools: the one block the context (a user message, an earlier answer) stated
   for that path;
5. shell tools: the one fenced command this turn's output stated that starts with the
   command prefix written so far.

Anything ambiguous (two different blocks, a block never closed, no path near a block,
two earlier calls that differ) gives no plan: a jump must be the model's own choice,
only written faster. The plan's text is the family's completer's: the rest of the call
in the model's own format.

Each plan records where its content comes from (`JumpPlan.origin`, what `jump`'s
`sources=output|context` option filters on): "output" for rules 1 and 5 and a repeat
of a call made earlier this turn; "context" for rule 4 and a repeat of a call in the
prompt. Rule 2 is "output": the new text, the bulk of the call and its decision, is
the model's own statement this turn; the old text is a lookup of the file as a tool
result shows it, and the pair is not a copy of anything the context holds whole. Its
`source_in`/`source` still name the old text's span in the context (the span the
intervention record points at).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .api import BoundaryEvent, Intervention
from .call_text import CallFormat, PartialCall, complete, parse_partial
from .jump_sources import Block, EarlierCall, Haystack, blocks_for_path, blocks_in, earlier_calls, lead_names

if TYPE_CHECKING:
    from jumpahead.engine.strict.tool_formats import ToolFamily

PATH_KEYS = ("path", "file_path", "filePath", "filename", "file", "target_file", "absolute_path", "notebook_path")
CONTENT_KEYS = ("content", "file_text", "contents", "text", "code", "new_content")
OLD_KEYS = ("old_string", "old_str", "oldString", "old_text")
NEW_KEYS = ("new_string", "new_str", "newString", "new_text")
# bare `old`/`new` (the live world's edit_file, live/sandbox.py): too generic to name a
# role alone, so they count only for a tool that is an edit by its name or command
_EDIT_OLD_KEYS = (*OLD_KEYS, "old")
_EDIT_NEW_KEYS = (*NEW_KEYS, "new")
COMMAND_KEYS = ("command", "cmd", "script")
_WRITE = re.compile(r"(?i)write|create|save")
_EDIT = re.compile(r"(?i)edit|replace")
_SHELL = re.compile(r"(?i)bash|shell|exec|run|terminal|command")
_INLINE_EDIT = re.compile(r"(?i)\b(?:replace|change)\s+`([^`\n]+)`\s+(?:with|to|by|into)\s+`([^`\n]*)`")
MIN_PREFIX = 3  # command characters written before a shell call counts as aimed


@dataclass(frozen=True)
class ToolSpec:
    """What a policy knows of a tool: its argument names in schema order, the required ones."""

    name: str
    properties: tuple[str, ...] = ()
    required: frozenset[str] = frozenset()

    @classmethod
    def of(cls, name: str, parameters: dict | None) -> ToolSpec:
        props = (parameters or {}).get("properties") or {}
        required = (parameters or {}).get("required") or []
        return cls(name, tuple(props) if isinstance(props, dict) else (),
                   frozenset(r for r in required if isinstance(r, str)))


@dataclass
class Roles:
    kind: str  # write | edit | shell | other
    path_key: str | None = None
    content_key: str | None = None
    old_key: str | None = None
    new_key: str | None = None
    command_key: str | None = None


def _first(keys: tuple[str, ...], known: list[str], default: str | None = None) -> str | None:
    return next((k for k in known if k in keys), default if not known or default in known else None)


def roles(tool: str, spec: ToolSpec | None, call: PartialCall) -> Roles:
    """The role of each argument of `tool` (from its schema, else from common names)."""
    known = list(spec.properties) if spec and spec.properties else []
    written = [*call.args, *([call.key] if call.key else [])]
    keys = known or written
    path_key = _first(PATH_KEYS, keys)
    command = call.args.get("command") if tool == "str_replace_editor" else None
    if path_key is None:  # no file argument: not a file tool, whatever its name says
        command = ""
    if command == "create" or (command is None and _WRITE.search(tool)):
        content = _first(CONTENT_KEYS, known, "file_text" if tool == "str_replace_editor" else "content")
        return Roles("write", path_key, content_key=content)
    if command == "str_replace" or (command is None and _EDIT.search(tool)):
        old = _first(_EDIT_OLD_KEYS, known, "old_str" if tool == "str_replace_editor" else "old_string")
        new = _first(_EDIT_NEW_KEYS, known, "new_str" if tool == "str_replace_editor" else "new_string")
        if old and new:
            return Roles("edit", path_key, old_key=old, new_key=new)
    command_key = _first(COMMAND_KEYS, keys)
    if command_key or _SHELL.search(tool):
        return Roles("shell", path_key, command_key=command_key or "command")
    return Roles("other", path_key)


@dataclass
class JumpPlan:
    """A decided jump: the arguments still to write, where they came from."""

    call: PartialCall | None
    fmt: Any  # CallFormat (Hermes), else the family's layout (engine/strict/tool_formats/)
    items: list[tuple[str, Any]]  # the arguments still to write (empty: only fixed_text known)
    roles: Roles | None
    source: tuple[int, int] | None = None
    source_in: str = "context"
    label: str = ""
    content_keys: list[str] = field(default_factory=list)  # keys holding content (perturbable)
    fixed_text: str | None = None  # a recorded continuation taken as is (oracle jumps)
    fixed_tokens: list[int] | None = None  # fixed_text as the record's own token ids (token-exact)
    origin: str | None = None  # where the content comes from, "output"/"context" (None: source_in; module doc)

    @property
    def content_from(self) -> str:
        return self.origin or self.source_in

    def text(self) -> str | None:
        if self.fixed_text is not None:
            return self.fixed_text
        if self.call is None:
            return None
        if isinstance(self.fmt, CallFormat):
            return complete(self.call, self.items, self.fmt)
        return self.fmt.complete(self.call, self.items)  # a family's layout (engine/strict/tool_formats/)

    def intervention(self) -> Intervention | None:
        text = self.text()
        if not text:
            return None
        tokens = self.fixed_tokens if self.fixed_text is not None else None
        return Intervention(text=text, tokens=tokens, source=self.source, source_in=self.source_in,  # type: ignore[arg-type]
                            label=self.label)


def arrange(call: PartialCall, spec: ToolSpec | None, wanted: dict[str, Any]) -> list[tuple[str, Any]] | None:
    """The not-yet-written arguments of `wanted`, in the order the writer must take them
    (the one being written first, then schema order); None when they do not fit what
    was written or leave a required argument out."""
    for key, value in wanted.items():
        if key in call.args and call.args[key] != value:
            return None
    rest = [k for k in wanted if k not in call.args]
    if spec and spec.properties:
        order = {k: i for i, k in enumerate(spec.properties)}
        rest.sort(key=lambda k: order.get(k, len(order)))
        if spec.required - set(call.args) - set(wanted):
            return None
    if call.stage in ("after_key", "after_colon", "string"):
        if call.key not in rest:
            return None
        rest.remove(call.key)  # type: ignore[arg-type]
        rest.insert(0, call.key)  # type: ignore[arg-type]
    elif call.stage == "key":
        hits = [k for k in rest if k.startswith(call.partial)]
        if len(hits) != 1:
            return None
        rest.remove(hits[0])
        rest.insert(0, hits[0])
    if call.stage == "string" and not str(wanted[rest[0]]).startswith(call.partial):
        return None
    return [(k, wanted[k]) for k in rest] or None


@dataclass
class ContextIndex:
    """What a request's prompt offers as content; built once per request (the prompt
    does not change while the row runs)."""

    text: str
    blocks: list[Block]
    calls: list[EarlierCall]
    hay: Haystack

    @classmethod
    def of(cls, text: str, start: str, end: str, family: ToolFamily | None = None) -> ContextIndex:
        return cls(text, blocks_in(text), calls_in(text, start, end, family), Haystack(text))


def is_hermes(family: ToolFamily | None) -> bool:
    """Hermes (or no family known): the reader and completer of partial.py, as always."""
    return family is None or family.name == "hermes"


def calls_in(text: str, start: str, end: str, family: ToolFamily | None = None) -> list[EarlierCall]:
    """The complete calls written in `text`, in the family's format."""
    if is_hermes(family):
        return earlier_calls(text, start, end)
    assert family is not None
    return [EarlierCall(c.name, c.arguments, c.start, c.end) for c in family.calls_in(text)]


def read_call(call_text: str, family: ToolFamily | None) -> tuple[PartialCall | None, Any]:
    """The call being written and the layout to complete it with."""
    if is_hermes(family):
        return parse_partial(call_text, None), None
    assert family is not None
    return family.read(call_text), family.layout(call_text)


def _strip_nl(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def edit_pair(scope: str, path: str, ctx: ContextIndex) -> tuple[str, str, str, tuple[int, int]] | None:
    """(old, new, account, old's span in the context) of the one edit stated for `path`."""
    blocks = blocks_in(scope)
    pairs: dict[tuple[str, str], tuple[str, tuple[int, int]]] = {}
    for a, b in zip(blocks, blocks[1:]):
        if not (a.closed and b.closed) or not lead_names(a.lead, path):
            continue
        old, new = _strip_nl(a.text), _strip_nl(b.text)
        span = ctx.hay.find(old)
        if span is not None and old != new:
            pairs[(old, new)] = (f"old from context[{span[0]}:{span[1]}] new from output[{b.start}:{b.end}]", span)
    for m in _INLINE_EDIT.finditer(scope):
        if not lead_names(scope[max(0, m.start() - 300) : m.start()] + " " + scope[m.end() : m.end() + 80], path):
            continue
        old, new = m.group(1), m.group(2)
        span = ctx.hay.find(old)
        if span is not None and old != new:
            pairs[(old, new)] = (f"old from context[{span[0]}:{span[1]}] new from output[{m.start(2)}:{m.end(2)}]", span)
    if len(pairs) != 1:
        return None
    (old, new), (account, span) = next(iter(pairs.items()))
    return old, new, account, span


def _repeat(call: PartialCall, tool: str, spec: ToolSpec | None, ctx: ContextIndex, scope: str,
            start: str, end: str, family: ToolFamily | None = None
            ) -> tuple[list[tuple[str, Any]], str, tuple[int, int], str] | None:
    """The rest of the one earlier call of `tool` that agrees with what is written."""
    found: dict[str, tuple[list[tuple[str, Any]], str, tuple[int, int], str]] = {}
    candidates = [(c, "context") for c in ctx.calls] + [(c, "output") for c in calls_in(scope, start, end, family)]
    for earlier, where in candidates:
        if earlier.name != tool or not set(call.args) <= set(earlier.arguments):
            continue
        items = arrange(call, spec, earlier.arguments)
        if items is None:
            continue
        key = repr(items)
        found[key] = (items, f"repeat of an earlier {tool} call at {where}[{earlier.start}:{earlier.end}]",
                      (earlier.start, earlier.end), where)
    return next(iter(found.values())) if len(found) == 1 else None


def plan_online(event: BoundaryEvent, ctx: ContextIndex, tools: dict[str, ToolSpec],
                start: str, end: str, family: ToolFamily | None = None) -> JumpPlan | None:
    """The online jump at this boundary, or None (see the module doc for the rules)."""
    call, layout = read_call(event.call_text, family)
    if call is None:
        return None
    fmt = CallFormat.detect(event.call_text, end) if layout is None else layout
    spec = tools.get(call.name)
    if tools and spec is None:
        return None  # a tool the request does not offer: the model is off course
    r = roles(call.name, spec, call)
    cut = event.output_text.rfind(start)
    scope = event.output_text[:cut] if cut >= 0 else event.output_text
    path = call.args.get(r.path_key) if r.path_key else None
    if r.kind in ("write", "edit"):
        if not isinstance(path, str) or not path:
            return None  # destination not fixed yet
    elif not call.args and not (call.stage == "string" and len(call.partial) >= MIN_PREFIX):
        return None

    def plan(wanted: dict[str, Any], source: tuple[int, int], where: str, label: str, keys: list[str]) -> JumpPlan | None:
        items = arrange(call, spec, wanted)
        if items is None:
            return None
        return JumpPlan(call, fmt, items, r, source, where, label, [k for k in keys if k in dict(items)])

    if r.kind == "write" and r.content_key:
        found = blocks_for_path(blocks_in(scope), path)  # type: ignore[arg-type]
        if found.reason in ("ambiguous", "unclosed"):
            return None
        if found.block is not None:
            b = found.block
            return plan({r.content_key: b.text}, (b.start, b.end), "output",
                        f"{call.name} path={path} content from output block [{b.start}:{b.end}]", [r.content_key])
    if r.kind == "edit" and r.old_key and r.new_key:
        pair = edit_pair(scope, path, ctx)  # type: ignore[arg-type]
        if pair is not None:
            old, new, account, span = pair
            p = plan({r.old_key: old, r.new_key: new}, span, "context", f"{call.name} path={path} {account}",
                     [r.new_key, r.old_key])
            if p is not None:
                p.origin = "output"  # the new text is this turn's statement (module doc)
            return p
    repeat = _repeat(call, call.name, spec, ctx, scope, start, end, family)
    if repeat is not None:
        items, label, span, where = repeat
        keys = [k for k in (r.content_key, r.new_key, r.command_key) if k]
        return JumpPlan(call, fmt, items, r, span, where, label, [k for k in keys if k in dict(items)] or
                        [k for k, v in items if isinstance(v, str)])
    if r.kind == "write" and r.content_key:
        found = blocks_for_path(ctx.blocks, path)  # type: ignore[arg-type]
        if found.block is not None:
            b = found.block
            return plan({r.content_key: b.text}, (b.start, b.end), "context",
                        f"{call.name} path={path} content from context block [{b.start}:{b.end}]", [r.content_key])
        return None
    if r.kind == "shell" and r.command_key and call.stage == "string" and call.key == r.command_key:
        hits = {_strip_nl(b.text): b for b in blocks_in(scope) if b.closed and b.kind == "fence"
                and _strip_nl(b.text).startswith(call.partial) and _strip_nl(b.text) != call.partial}
        if len(hits) == 1:
            command, b = next(iter(hits.items()))
            return plan({r.command_key: command}, (b.start, b.end), "output",
                        f"{call.name} command from output block [{b.start}:{b.end}]", [r.command_key])
    return None
