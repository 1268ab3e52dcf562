"""Forced-continuation replay: `jumpahead serve --script FILE`.

A script lists, per turn, the assistant output to produce: reasoning, text and tool
calls. Each chat, messages or responses request consumes the next turn. The turn is
rendered into the model's own output format (reasoning between the think markers,
tool calls as the chat template writes them), tokenized, ended with the EOS token, and
appended through the real model as asserted `scripted` tokens. The real output parser
and the real wire protocols turn those tokens into the protocol's answer, so an agent runs
end to end on a model too small to act, and every token carries its provenance.

File format (JSONL: one turn per line; or one JSON document, a list of turns or
`{"turns": [...]}`):

    {"reasoning": "optional", "text": "optional", "tool_calls": [{"name": "write", "arguments": {"path": "a.txt"}}]}

`arguments` is an object (or a JSON text of one). A turn with none of the three keys
is an empty answer. `comment` is ignored.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from jumpahead.engine.methods.proposal import Proposal, RowView

from .errors import APIError, invalid_request
from .exchange import BaseHooks, Exchange
from .output_parser import OutputParser
from .turn_runner import PreparedTurn, validate_request
from .turn import Tool, TurnOutput

log = logging.getLogger(__name__)

TURN_KEYS = {"text", "reasoning", "tool_calls", "comment"}
# Logit bias that makes the row's one sampled position before the first proposal (the
# token after the prompt) pick the script's first token.


class ScriptError(ValueError):
    """A script file that cannot be read or has a malformed turn."""


@dataclass
class ScriptedCall:
    name: str
    arguments: Any = field(default_factory=dict)  # a JSON value, normally an object


@dataclass
class ScriptTurn:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ScriptedCall] = field(default_factory=list)


def _turn(raw: Any, where: str) -> ScriptTurn:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: a turn must be a JSON object, got {type(raw).__name__}")
    unknown = set(raw) - TURN_KEYS
    if unknown:
        raise ScriptError(f"{where}: unknown keys {sorted(unknown)} (a turn has {sorted(TURN_KEYS - {'comment'})})")
    for key in ("text", "reasoning"):
        if not isinstance(raw.get(key, ""), str):
            raise ScriptError(f"{where}: {key} must be a string")
    calls = raw.get("tool_calls", [])
    if not isinstance(calls, list):
        raise ScriptError(f"{where}: tool_calls must be an array")
    parsed = []
    for j, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise ScriptError(f"{where}: tool_calls[{j}] needs a non-empty string name")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = orjson.loads(arguments) if arguments.strip() else {}
            except orjson.JSONDecodeError as exc:
                raise ScriptError(f"{where}: tool_calls[{j}].arguments is not valid JSON: {exc}") from None
        parsed.append(ScriptedCall(call["name"], arguments))
    return ScriptTurn(text=raw.get("text", ""), reasoning=raw.get("reasoning", ""), tool_calls=parsed)


def parse_script(text: str, source: str = "<script>") -> list[ScriptTurn]:
    """Turns from a script's text (JSONL, a JSON list, or {"turns": [...]})."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "turns" in doc:
        doc = doc["turns"]
    if isinstance(doc, list):
        return [_turn(raw, f"{source} turn {i + 1}") for i, raw in enumerate(doc)]
    if isinstance(doc, dict):
        return [_turn(doc, f"{source} turn 1")]
    turns = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ScriptError(f"{source} line {n}: not JSON: {exc}") from None
        turns.append(_turn(raw, f"{source} line {n}"))
    return turns


class Script(BaseHooks):
    """The turns to serve, in order; each served request consumes one.

    A hook (core/exchange.py) like the policy runtime and the recorder: it takes each
    row's output (`take_output`) before the engine runs."""

    def __init__(self, turns: list[ScriptTurn], *, source: str = "<script>", prompt_limit: int | None = None) -> None:
        self.turns = list(turns)
        self.source = source
        # Prompts longer than this many tokens are cut in the middle before the model
        # runs (script mode only: the continuation is fixed, so the prompt's content
        # does not change the answer, only the time spent prefilling it).
        self.prompt_limit = prompt_limit
        self.served = 0
        self._lock = threading.Lock()
        self._starts: tuple[Any, frozenset[int]] | None = None  # (tokenizer, its message start ids)
        self._cut: Cut | None = None  # the last turn's cut, kept while later prompts extend it

    @classmethod
    def load(cls, path: str | Path, prompt_limit: int | None = None) -> Script:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ScriptError(f"cannot read script {p}: {exc}") from None
        turns = parse_script(text, str(p))
        if not turns:
            raise ScriptError(f"script {p} has no turns")
        return cls(turns, source=str(p), prompt_limit=prompt_limit)

    @contextlib.contextmanager
    def claim(self) -> Iterator[tuple[int, ScriptTurn]]:
        """The next turn; it counts as served only if the `with` block succeeds."""
        with self._lock:
            if self.served >= len(self.turns):
                raise APIError(
                    f"script exhausted: all {len(self.turns)} turns of {self.source} were served",
                    status=400, code="script_exhausted",
                )
            index = self.served
            yield index, self.turns[index]
            self.served = index + 1

    def max_bytes(self) -> int:
        """Upper bound on a rendered turn's UTF-8 size (a byte-level token covers >= 1 byte)."""
        def size(turn: ScriptTurn) -> int:
            calls = sum(len(orjson.dumps({"name": c.name, "arguments": c.arguments})) + 64 for c in turn.tool_calls)
            return len(turn.text.encode()) + len(turn.reasoning.encode()) + calls + 64
        return max((size(t) for t in self.turns), default=64)

    def _message_starts(self, tokenizer: Any) -> frozenset[int]:
        if self._starts is None or self._starts[0] is not tokenizer:
            self._starts = (tokenizer, message_start_ids(tokenizer))
        return self._starts[1]

    def status(self) -> dict[str, Any]:
        return {"file": self.source, "turns": len(self.turns), "served": self.served}

    def take_output(self, engine: Any, exchange: Exchange, prepared: PreparedTurn) -> bool:
        """The next turn becomes the row's continuation (asserted `scripted` tokens);
        it is consumed only when the request is valid. The prompt is cut to fit."""
        tokenizer, request, turn = engine.tokenizer, prepared.request, prepared.turn
        tools = turn.tools if turn.tools_enabled else None
        with self.claim() as (index, scripted):
            tokens = turn_tokens(tokenizer, render_turn(tokenizer, scripted, in_reasoning=prepared.in_reasoning,
                                                        tools=tools))
            room = engine.context_length - len(tokens) - 2
            if room < 16:
                raise invalid_request(f"script turn {index + 1} is {len(tokens)} tokens; it does not fit the "
                                      f"model's {engine.context_length}-token context", code="context_length_exceeded")
            # the grid of the cut: the configured limit, else the context (not `room`: it
            # changes with each turn's answer, and the cut would move with it)
            window = min(self.prompt_limit or engine.context_length, engine.context_length)
            request.prompt, self._cut = sticky_fit(request.prompt, min(room, window), window=window,
                                                   starts=self._message_starts(tokenizer), previous=self._cut)
            proposer = ScriptedProposer(tokens)
            request.proposers = [proposer]
            validate_request(engine, request)
        prepared.scripted, prepared.script_turn = proposer, index
        return True


# --- rendering a turn in the model's own format ---------------------------------------


def _reasoning_text(tokenizer: Any, turn: ScriptTurn, in_reasoning: bool) -> str:
    has_thinking = bool(getattr(tokenizer, "has_thinking", False))
    start, end = (tokenizer.think_start, tokenizer.think_end) if has_thinking else ("<think>", "</think>")
    if in_reasoning:  # the template already opened the block: always close it
        return f"{turn.reasoning.strip()}\n{end}\n\n" if turn.reasoning else f"\n{end}\n\n"
    if not turn.reasoning:
        return ""
    return f"{start}\n{turn.reasoning.strip()}\n{end}\n\n"


def _json_calls(tokenizer: Any, turn: ScriptTurn) -> str:
    start = getattr(tokenizer, "tool_call_start", None) or "<tool_call>"
    end = getattr(tokenizer, "tool_call_end", None) or "</tool_call>"
    blocks = []
    for call in turn.tool_calls:
        body = orjson.dumps({"name": call.name, "arguments": call.arguments}).decode()
        blocks.append(f"{start}\n{body}\n{end}")
    return "\n".join(blocks)


def _template_calls(tokenizer: Any, turn: ScriptTurn, tools: list[Tool]) -> str | None:
    """The tool calls as the chat template writes an assistant message (None if it cannot)."""
    openai_tools = [t.as_openai() for t in tools] or None
    user = {"role": "user", "content": "x"}
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(turn.tool_calls)
        ],
    }
    try:
        head = tokenizer.apply_chat_template([user], tools=openai_tools, add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template([user, assistant], tools=openai_tools, tokenize=False)
    except Exception as exc:  # a template without tool calls, or one that wants other shapes
        log.debug("template cannot render scripted tool calls: %s", exc)
        return None
    if not isinstance(head, str) or not isinstance(full, str) or not full.startswith(head):
        return None
    tail = full[len(head):]
    eos = getattr(tokenizer, "eos_token", None)
    if eos and eos in tail:
        tail = tail[: tail.rindex(eos)]
    return tail.strip()


def _parsed(tokenizer: Any, text: str, tools: list[Tool] | None, in_reasoning: bool) -> TurnOutput:
    parser = OutputParser.for_tokenizer(tokenizer, tools, in_reasoning=in_reasoning)
    out = TurnOutput()
    for event in parser.feed(text) + parser.finish():
        out.add(event)
    return out


def _json_value(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _matches(out: TurnOutput, turn: ScriptTurn) -> bool:
    calls = [(c.name, _json_value(c.arguments)) for c in out.tool_calls]
    return (
        out.reasoning.strip() == turn.reasoning.strip()
        and out.content.strip() == turn.text.strip()
        and calls == [(c.name, c.arguments) for c in turn.tool_calls]
    )


def render_turn(tokenizer: Any, turn: ScriptTurn, *, in_reasoning: bool = False,
                tools: list[Tool] | None = None, prefer_template: bool = False) -> str:
    """The turn as the model would write it (without the EOS token).

    Tool calls are written in the `<tool_call>` JSON form; when the tokenizer's parser
    does not read that form back, the chat template's own rendering is used instead.
    `prefer_template`: the template's rendering first (byte for byte what the model
    sees of its own earlier calls in the history; forced replay uses it so a recorded
    call has the tokens the template gives it, `", "` separators included).
    """
    head = _reasoning_text(tokenizer, turn, in_reasoning) + turn.text
    if not turn.tool_calls:
        return head
    sep = "\n" if turn.text else ""
    if prefer_template and tools:
        templated = _template_calls(tokenizer, turn, tools)
        if templated is not None and _matches(_parsed(tokenizer, head + sep + templated, tools, in_reasoning), turn):
            return head + sep + templated
    text = head + sep + _json_calls(tokenizer, turn)
    if not tools:
        log.warning("scripted turn has tool calls but the request offers no tools: they arrive as text")
        return text
    if _matches(_parsed(tokenizer, text, tools, in_reasoning), turn):
        return text
    templated = _template_calls(tokenizer, turn, tools)
    if templated is not None:
        alt = head + sep + templated
        if _matches(_parsed(tokenizer, alt, tools, in_reasoning), turn):
            return alt
    log.warning("scripted tool calls do not parse back with this model's tool parser; sending them as written")
    return text


def turn_tokens(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered turn, ended with the EOS token so the row stops there."""
    ids = tokenizer.encode(text, add_special_tokens=False) if text else []
    eos = tokenizer.eos_token_id
    if eos is None:
        eos = sorted(tokenizer.eos_token_ids)[0]
    return [int(t) for t in ids] + [int(eos)]


def fit_prompt(prompt: list[int], limit: int, *, window: int | None = None,
               starts: Collection[int] = ()) -> list[int]:
    """The prompt cut to at most `limit` tokens: a fixed head, a dropped middle, the tail.

    Sticky, as the policies' rewrites are (policies/sticky.py): agents resend the whole
    history every turn, appending to it, and a cut that moved with every turn (as a
    half/half cut does) would leave every token after it to prefill again. So the cut
    lies on a grid that the history's growth does not move:

    - the grid comes from `window` (the configured prompt limit or the model's context:
      the same every turn; default `limit`; `limit` itself where it is under three
      quarters of it, a huge answer's turn): the head is its first quarter, a block is
      another quarter;
    - the dropped middle, right after the head, is the fewest whole blocks that make the
      prompt fit. While the history grows by less than a block the count stays, so the
      next turn's fitted prompt starts with this turn's; past it, one more block goes
      (the cut moves once per block of growth, never back while the history only grows),
      and the next turns fit again;
    - `starts`: token ids that open a chat message (ChatML's <|im_start|>). The head ends
      before one, and the tail begins at one, where one lies within a quarter block of
      the grid's position (so the kept parts are whole messages where the prompt allows);
      the search stays in the tokens the previous turn had, so it moves nothing.

    A pure function of (prompt, limit, window, starts): a restarted server cuts the same
    prompt the same way. The output keeps the prompt's newest tokens, the generation
    prompt included: more than a quarter of the limit always, half the window less a
    quarter block where the limit is the window. A cut between tokens never splits a
    special token; it may split a message, as any cut without `starts` does.
    """
    if len(prompt) <= limit:
        return prompt
    head, cut = fit_bounds(prompt, limit, window=window, starts=starts)
    return prompt[:head] + prompt[cut:]


def fit_bounds(prompt: list[int], limit: int, *, window: int | None = None,
               starts: Collection[int] = ()) -> tuple[int, int]:
    """fit_prompt's cut of a prompt longer than `limit`: it keeps prompt[:head] + prompt[cut:]."""
    if limit <= 0:
        return 0, len(prompt)
    return _bounds(prompt, limit, _grid(limit, window), starts)


def _grid(limit: int, window: int | None) -> int:
    grid = max(limit, window or limit)
    return limit if 4 * limit < 3 * grid else grid  # a grid that would leave too little tail: this turn's own


def _bounds(prompt: list[int], limit: int, grid: int, starts: Collection[int]) -> tuple[int, int]:
    n = len(prompt)
    head = grid // 4
    block = max(1, grid // 4)
    dropped = block * -(-(n - limit) // block)  # the fewest whole blocks that fit
    cut = head + dropped  # the tail's first token
    reach = block // 4
    if starts and reach:
        at = set(starts)
        head = next((i for i in range(head, max(head - reach, 0), -1) if prompt[i] in at), head)
        cut = next((j for j in range(cut, min(cut + reach, n)) if prompt[j] in at), cut)
    return head, cut


@dataclass(frozen=True)
class Cut:
    """Where a prompt was cut: `prompt[:head] + prompt[cut:]` was sent."""

    prompt: tuple[int, ...]
    head: int
    cut: int


def sticky_fit(prompt: list[int], limit: int, *, window: int | None = None, starts: Collection[int] = (),
               previous: Cut | None = None) -> tuple[list[int], Cut | None]:
    """`fit_prompt` with memory: the cut stays where it was while the history only grows
    and still fits, and where it has to move it moves far, leaving a block of room.

    The pure rule alone moves the cut whenever the growing history crosses a block
    boundary, and the first turn can land anywhere below one (a real Claude Code task:
    turn 1 fitted 8,025 of 8,160 tokens, turn 3 crossed and re-prefilled 4k). Here a
    prompt that extends the previous turn's (the same head, the same tokens from the cut
    on) keeps its cut while it fits; a new cut is made for a quarter-window less than the
    limit, so the next several turns fit behind it. A restarted server has no memory: its
    first cut is made afresh (one cache miss where it lands elsewhere), sticky from there.
    """
    n = len(prompt)
    if previous is not None and n - (previous.cut - previous.head) <= limit:
        old = previous.prompt
        if (n >= len(old) and prompt[:previous.head] == list(old[:previous.head])
                and prompt[previous.cut:len(old)] == list(old[previous.cut:])):
            return prompt[:previous.head] + prompt[previous.cut:], previous
    if n <= limit:
        return prompt, None
    grid = _grid(limit, window)
    room = limit - grid // 4 if limit - grid // 4 >= grid // 2 else limit  # room to spare where it leaves half
    head, cut = _bounds(prompt, room, grid, starts)
    return prompt[:head] + prompt[cut:], Cut(tuple(prompt), head, cut)


def message_start_ids(tokenizer: Any) -> frozenset[int]:
    """Token ids that open a chat message under the tokenizer's template: the first
    token of a second message where it is a special token (ChatML's <|im_start|>, Llama
    3's <|start_header_id|>); empty where the template does not say."""
    try:
        user = {"role": "user", "content": "x"}
        one = tokenizer.apply_chat_template([user], tokenize=True)
        two = tokenizer.apply_chat_template([user, {"role": "assistant", "content": "y"}], tokenize=True)
        one, two = (list(t["input_ids"] if isinstance(t, dict) else t) for t in (one, two))
        special = set(getattr(tokenizer, "all_special_ids", None) or ())
    except Exception as exc:  # a template that wants other shapes: no message boundaries
        log.debug("cannot find the template's message start token: %s", exc)
        return frozenset()
    if len(two) <= len(one) or two[: len(one)] != one or int(two[len(one)]) not in special:
        return frozenset()
    return frozenset({int(two[len(one)])})


class ScriptedProposer:
    """Proposes the not-yet-emitted rest of a scripted turn as asserted tokens.

    The engine takes an asserted first token instead of sampling after the prompt,
    and samples only after the last slice of an asserted run (a run cut by
    EngineConfig.max_asserted continues next round); the script ends with the EOS
    token, which ends the row. Output tokens that are not the script's (there should
    be none) are counted as strays and the script continues after them.
    """

    name = "scripted"

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)
        self.cursor = 0  # script tokens emitted so far
        self.seen = 0  # output tokens accounted for
        self.strays = 0  # output tokens that are not the script's

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        out = view.tokens[view.prompt_len:]
        for tok in out[self.seen:]:
            if self.cursor < len(self.tokens) and tok == self.tokens[self.cursor]:
                self.cursor += 1
            else:
                self.strays += 1
        self.seen = len(out)
        rest = self.tokens[self.cursor : self.cursor + max_len]
        return Proposal(rest, "scripted") if rest else None

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        pass  # asserted tokens are always taken; propose() reads the row itself
