"""Logical jump-ahead policies (docs/design.md): supply the rest of a tool call unverified.

- `Jump` (`jump`): online. Once the model has opened a call and fixed its destination,
  and the context already holds the complete literal content of the remaining arguments
  (jump_plan.py says where it looks), the rest of the call is appended as asserted
  `jump` tokens, written in the model's own format; the model samples again after the
  end marker. Options: `sources=all|output|context` keeps only plans whose content
  comes from this turn's output or from the prompt's context (`JumpPlan.content_from`,
  jump_plan.py's module doc); `verify=1` proposes the plan for verification instead (the
  model checks it token by token like echo: exact; still kind `jump`).
- `OracleJump` (`oracle-jump`): driven by the recorded continuation of this turn
  (`turn.options.oracle_output`, set by replay). At a tool name or
  argument key it supplies the longest prefix of the recorded rest of the call whose
  content already exists before the jump point (context or output so far): hindsight
  decides *what* comes, never content the model could not have copied.
- `MistakenJump` (`mistaken-jump:rate=R,seed=S[,base=online|oracle]`): the same jumps,
  a fraction R of them perturbed deterministically (wrong path, truncated content,
  content of another file), to measure how the model detects and recovers.

Each policy instance keeps per-request state (the request's tools, markers, the oracle
text, a context index); hooks are cheap after the first boundary of a request.

Every tool-call family is served: the request's family (detected from the tokenizer,
engine/strict/tool_formats/) reads the call being written and writes its rest, so a jump
appends a call in the model's own format (Hermes JSON, Qwen3-Coder XML, GLM, Kimi,
Mistral, harmony, DeepSeek, Llama 3 JSON).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
import time
from typing import Any

from .api import BoundaryEvent, Intervention, Policy, RequestContext, flag_option
from .call_text import DEFAULT_END, DEFAULT_START, CallFormat, parse_partial
from .jump_plan import (
    CONTENT_KEYS,
    NEW_KEYS,
    ContextIndex,
    JumpPlan,
    ToolSpec,
    arrange,
    calls_in,
    is_hermes,
    plan_online,
    read_call,
    roles,
)
from .jump_sources import Haystack, blocks_in, names_path, paths_in

_STRUCTURAL_KEYS = frozenset({"name", "arguments", "parameters"})
_SYNTAX = re.compile(r"[\s{}\[\],:]+")
_LITERAL = re.compile(r"-?[\w.+-]+")
_SENTINEL = "\ue000"  # a private-use character: where a family's writing of a cut call stops
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)


class _JumpPolicy(Policy):
    """Shared plumbing: request configuration, the context index, decision telemetry."""

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.tools: dict[str, ToolSpec] = {}
        self.start, self.end = DEFAULT_START, DEFAULT_END
        self.family: Any = None  # the request's ToolFamily (None: Hermes)
        self._index: ContextIndex | None = None
        self.verify = False  # propose the plan for verification (exact) instead of asserting it
        # per boundary: {"boundary", "seconds", "jumped", "chars", "label"} (H, tokens supplied)
        self.decisions: list[dict[str, Any]] = []

    def on_request(self, ctx: RequestContext) -> None:
        self.configure(ctx)
        return None

    def configure(self, ctx: RequestContext) -> None:
        """Read what the hooks need from the request: tools, the model's call markers."""
        self.tools = {t.name: ToolSpec.of(t.name, t.parameters) for t in ctx.turn.tools}
        from jumpahead.engine.strict.tool_formats import detect_family

        family = detect_family(ctx.tokenizer)
        self.family = None if is_hermes(family) else family
        own = getattr(ctx.tokenizer, "tool_call_start", None)
        self.start = own or (self.family.start if self.family else DEFAULT_START)
        self.end = (getattr(ctx.tokenizer, "tool_call_end", None) if own else None) or (
            self.family.end if self.family else DEFAULT_END)
        self._index = None

    def index(self, context_text: str) -> ContextIndex:
        idx = self._index
        if idx is None or idx.text is not context_text and idx.text != context_text:
            idx = self._index = ContextIndex.of(context_text, self.start, self.end, self.family)
        return idx

    def on_tool_name(self, event: BoundaryEvent) -> Intervention | None:
        return self.decide(event)

    def on_argument_key(self, event: BoundaryEvent) -> Intervention | None:
        return self.decide(event)

    def decide(self, event: BoundaryEvent) -> Intervention | None:
        t0 = time.perf_counter()
        plan = self.plan(event)
        out = plan.intervention() if plan is not None else None
        if out is not None and self.verify:
            out.verified = True
        self.decisions.append({"boundary": event.boundary, "seconds": time.perf_counter() - t0,
                               "jumped": out is not None, "chars": len(out.text or "") if out else 0,
                               "label": out.label if out else ""})
        return out

    def plan(self, event: BoundaryEvent) -> JumpPlan | None:
        raise NotImplementedError


class Jump(_JumpPolicy):
    """Online logical jump-ahead (see the module doc and jump_plan.py)."""

    name = "jump"
    SOURCES = ("all", "output", "context")

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.sources = str(options.get("sources", "all")).strip().lower()
        if self.sources not in self.SOURCES:
            raise ValueError(f"jump: sources must be one of {', '.join(self.SOURCES)}, got {options['sources']!r}")
        self.verify = flag_option(options, "verify", "jump")

    def plan(self, event: BoundaryEvent) -> JumpPlan | None:
        plan = plan_online(event, self.index(event.context_text), self.tools, self.start, self.end, self.family)
        # a filter on the plan `all` takes, never a fall-back to another rule: where the
        # output stated a block, a different block of the context is not the model's choice
        if plan is not None and self.sources != "all" and plan.content_from != self.sources:
            return None
        return plan


def oracle_output(turn: Any) -> str | None:
    """The recorded output of this turn, as replay hands it over."""
    return turn.options.oracle_output or None


def _string_end(text: str, i: int) -> int:
    """Index of the closing quote of a JSON string whose content starts at i (-1: none)."""
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i
        i += 1
    return -1


def _raw_offset(raw: str, decoded_chars: int) -> int:
    """The offset in an escaped JSON string body after `decoded_chars` decoded characters
    (never inside an escape)."""
    i = count = 0
    while i < len(raw) and count < decoded_chars:
        if raw[i] == "\\":
            if raw[i + 1 : i + 2] == "u":
                code = int(raw[i + 2 : i + 6], 16)
                i += 12 if 0xD800 <= code < 0xDC00 and raw[i + 6 : i + 8] == "\\u" else 6
            else:
                i += 2
        else:
            i += 1
        count += 1
    return i


def _open_string(call_text: str) -> str | None:
    """The raw text of the JSON string the call text is inside of, or None outside."""
    i, start = 0, None
    while i < len(call_text):
        c = call_text[i]
        if start is not None and c == "\\":
            i += 2
            continue
        if c == '"':
            start = None if start is not None else i + 1
        i += 1
    return call_text[start:] if start is not None else None


class OracleJump(_JumpPolicy):
    """Jumps the recorded rest of a call as far as its content is already sourced."""

    name = "oracle-jump"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        try:
            self.min_chars = int(options.get("min_chars", "16"))
        except ValueError:
            raise ValueError(f"oracle-jump: min_chars must be an integer, got {options['min_chars']!r}") from None
        self.oracle: str | None = None
        self._tokenizer: Any = None
        self._ids: list[int] | None = None  # the recording's token ids (lazily)

    def configure(self, ctx: RequestContext) -> None:
        super().configure(ctx)
        self.oracle = oracle_output(ctx.turn)
        self._tokenizer, self._ids = ctx.tokenizer, None

    def _record_tokens(self, event: BoundaryEvent, end: int) -> list[int] | None:
        """The recording's own token ids from the jump point up to its last token
        boundary at or before character `end`. A jump cut mid-token and re-encoded spells
        the text with other tokens than the record's, so forced replay would diverge
        although the text is right. None where the output so far is not the recording's
        tokens or the tokenizer cannot say (then the text is supplied as it is)."""
        tok, oracle = self._tokenizer, self.oracle
        if tok is None or not oracle or not hasattr(tok, "decode"):
            return None
        if self._ids is None:
            self._ids = [int(t) for t in tok.encode(oracle, add_special_tokens=False)]
        ids, n = self._ids, len(event.output_tokens)
        if [int(t) for t in event.output_tokens] != ids[:n] or tok.decode(ids[:n]) != event.output_text:
            return None
        lo, hi = n, len(ids)  # the largest m whose decoded prefix ends at or before `end`
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(tok.decode(ids[:mid])) <= end:
                lo = mid
            else:
                hi = mid - 1
        while lo > n and not oracle.startswith(tok.decode(ids[:lo])):
            lo -= 1  # a byte-level token that splits a character: stop before it
        return ids[n:lo]

    def plan(self, event: BoundaryEvent) -> JumpPlan | None:
        oracle, out = self.oracle, event.output_text
        if not oracle or not oracle.startswith(out):
            return None  # no recording, or the model left it
        if self.family is not None:
            return self._plan_family(event)
        stop = oracle.find(self.end, len(out))
        if stop < 0 or oracle.find(self.start, len(out), stop) >= 0:
            return None  # the recording does not continue this call
        rest = oracle[len(out) : stop + len(self.end)]
        supplied, spans = self._walk(rest, _open_string(event.call_text), self._hays(event))
        if supplied <= 0 or (fixed := self._fixed(event, rest, supplied)) is None:
            return None
        call = parse_partial(event.call_text)
        fmt = CallFormat.detect(event.call_text, self.end)
        items: list[tuple[str, Any]] = []
        if len(fixed[0]) == len(rest) and call is not None:
            items = self._items(call, event.call_text + rest[: -len(self.end)]) or []
        return self._oracle_plan(call, fmt, items, items, spans, rest, *fixed)

    def _hays(self, event: BoundaryEvent) -> tuple[tuple[str, Haystack], ...]:
        """Where an oracle jump's content may come from: the context, the output so far."""
        return (("context", self.index(event.context_text).hay), ("output", Haystack(event.output_text)))

    def _fixed(self, event: BoundaryEvent, rest: str, supplied: int) -> tuple[str, list[int] | None] | None:
        """The text to supply, `rest[:supplied]`, and where the recording's tokens are
        known, as whole recorded tokens (the text those decode to); None when not one
        whole token fits."""
        out = event.output_text
        tokens = self._record_tokens(event, len(out) + supplied)
        if tokens is None:
            return rest[:supplied], None
        if not tokens:
            return None
        n = len(event.output_tokens) + len(tokens)
        return self.oracle[len(out):len(self._tokenizer.decode(self._ids[:n]))], tokens

    def _oracle_plan(self, call: Any, fmt: Any, items: list[tuple[str, Any]], known: list[tuple[str, Any]],
                     spans: list[tuple[str, int, int]], rest: str, text: str,
                     tokens: list[int] | None) -> JumpPlan:
        """The oracle jump supplying `text` of the recorded `rest` of the call (`tokens`
        its recorded ids, if known): `items` the arguments to write, `known` those whose
        content keys count as supplied, `spans` where the content came from."""
        r = roles(call.name, self.tools.get(call.name), call) if call else None
        best = max(spans, key=lambda s: s[2] - s[1], default=None)
        sourced = sum(e - s for _, s, e in spans)
        label = (f"oracle {call.name if call else '?'}: {len(text)}/{len(rest)} chars of the recorded call, "
                 f"{sourced} content chars from {len(spans)} stretches"
                 + ("" if len(text) == len(rest) else "; stopped at unsourced content"))
        keys = [k for k in (r.content_key, r.new_key, r.command_key) if k] if r else []
        return JumpPlan(call, fmt, items, r, (best[1], best[2]) if best else None, best[0] if best else "context",
                        label, [k for k in keys if k in dict(known)], fixed_text=text, fixed_tokens=tokens)

    def _plan_family(self, event: BoundaryEvent) -> JumpPlan | None:
        """The oracle jump for a family other than Hermes: the recorded call's remaining
        arguments, in order, as far as their keys and content are sourced; the text
        supplied is the recording's own (its longest common prefix with the family's
        writing of the sourced part)."""
        family, oracle, out = self.family, self.oracle, event.output_text
        assert oracle is not None
        call, layout = read_call(event.call_text, family)
        stop = family.call_end(oracle, len(out))
        if call is None or stop is None or stop <= len(out):
            return None
        rest = oracle[len(out):stop]
        whole = None
        for m in range(len(rest), max(-1, len(rest) - 96), -1):  # the call less its closing
            whole, _ = read_call(event.call_text + rest[:m], family)
            if whole is not None and whole.stage in ("after_value", "open"):
                break
            whole = None
        if whole is None:
            return None
        items = arrange(call, None, whole.args) or []
        hays = self._hays(event)
        spans: list[tuple[str, int, int]] = []
        cut: tuple[int, str, Any] | None = None  # (item index, key, value prefix) where sourcing stops
        for n, (key, value) in enumerate(items):
            first = n == 0 and call.stage in ("key", "after_key", "after_colon", "string")
            if not first and not any(h.contains(key) for _, h in hays):
                cut = (n, _SENTINEL, "")
                break
            if not isinstance(value, str):
                text = json.dumps(value, ensure_ascii=False)
                if not any(h.contains(text) for _, h in hays):
                    cut = (n, key, "")
                    break
                continue
            done = len(call.partial) if n == 0 and call.stage == "string" else 0
            k = self._cover(value, done, hays, spans)
            if k < len(value):
                cut = (n, key, value[:k])
                break
        if cut is None:
            candidate = family.complete(call, items, layout)
        else:
            n, key, prefix = cut
            candidate = family.complete(call, items[:n] + [(key, prefix + _SENTINEL)], layout)
            candidate = candidate[: candidate.find(_SENTINEL)] if candidate and _SENTINEL in candidate else None
        if not candidate:
            return None
        supplied = 0
        while supplied < min(len(candidate), len(rest)) and candidate[supplied] == rest[supplied]:
            supplied += 1
        if supplied <= 0 or (fixed := self._fixed(event, rest, supplied)) is None:
            return None
        # The arguments are written only when the whole call is supplied; their content
        # keys count either way (the family's writing stopped inside them, not before).
        whole_call = len(fixed[0]) == len(rest)
        return self._oracle_plan(call, layout, items if whole_call else [], items, spans, rest, *fixed)

    @staticmethod
    def _items(call: Any, body: str) -> list[tuple[str, Any]] | None:
        try:
            doc = json.loads(body)
        except json.JSONDecodeError:
            return None
        args = doc.get("arguments") if isinstance(doc, dict) else None
        return arrange(call, None, args) if isinstance(args, dict) else None

    def _walk(self, rest: str, open_raw: str | None,
              hays: tuple[tuple[str, Haystack], ...]) -> tuple[int, list[tuple[str, int, int]]]:
        """How much of `rest` is sourced: structure always (the format's), keys found in
        the prompt (the tool schemas), string values in stretches of >= min_chars found
        before the jump point (or whole, if short). Returns (chars, source spans)."""
        supplied, i, spans = 0, 0, []
        while i < len(rest):
            if open_raw is None and rest.startswith(self.end, i):
                i += len(self.end)
                supplied = i
                continue
            if open_raw is None and rest[i] != '"':
                m = _SYNTAX.match(rest, i) or _LITERAL.match(rest, i)
                if m is None:
                    break
                if not _SYNTAX.fullmatch(m.group(0)) and not any(h.contains(m.group(0)) for _, h in hays):
                    break
                i = supplied = m.end()
                continue
            prefix, body_at = (open_raw, i) if open_raw is not None else ("", i + 1)
            open_raw = None
            close = _string_end(rest, body_at)
            if close < 0:
                break
            raw = prefix + rest[body_at:close]
            try:
                value, done = json.loads(f'"{raw}"'), len(json.loads(f'"{prefix}"'))
            except json.JSONDecodeError:
                break
            if rest[close + 1 :].lstrip().startswith(":"):  # a key: the schema's, or the format's
                if value not in _STRUCTURAL_KEYS and not any(h.contains(f'"{value}"') for _, h in hays):
                    break
                i = supplied = close + 1
                continue
            k = self._cover(value, done, hays, spans)
            if k < len(value):
                supplied = body_at + _raw_offset(rest[body_at:close], k - done) if k > done else max(supplied, body_at)
                break
            i = supplied = close + 1
        return supplied, spans

    def _cover(self, value: str, k: int, hays: list, spans: list) -> int:
        """How far from k the longest copies in the sources cover `value` (each copy at
        least min_chars, unless it is the whole value); their spans go to `spans`."""
        while k < len(value):
            where, hay, j = max(((w, h, h.longest_from(value, k)) for w, h in hays), key=lambda t: t[2])
            if j - k < self.min_chars and not (k == 0 and j == len(value)):
                break
            span = hay.locate(value[k:j])
            if span is not None:
                spans.append((where, *span))
            k = j
        return k


_PERTURBATIONS = ("wrong_path", "truncated", "wrong_file")


class MistakenJump(_JumpPolicy):
    """Jumps of a base policy, a fraction `rate` of them perturbed (deterministic per seed)."""

    name = "mistaken-jump"

    def __init__(self, **options: str) -> None:
        opts = dict(options)
        try:
            self.rate = float(opts.pop("rate", "0.2"))
        except ValueError:
            raise ValueError(f"mistaken-jump: rate must be a number, got {options['rate']!r}") from None
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"mistaken-jump: rate must be between 0 and 1, got {self.rate}")
        self.seed = opts.pop("seed", "0")
        base = opts.pop("base", "online")
        if base in ("online", "jump"):
            self.base: _JumpPolicy = Jump(**opts)
        elif base in ("oracle", "oracle-jump"):
            self.base = OracleJump(**opts)
        else:
            raise ValueError(f"mistaken-jump: base must be 'online' or 'oracle', got {base!r}")
        super().__init__(**options)
        self.counts = {"jumps": 0, "perturbed": 0, **{k: 0 for k in _PERTURBATIONS}}

    def configure(self, ctx: RequestContext) -> None:
        super().configure(ctx)
        self.base.configure(ctx)

    def plan(self, event: BoundaryEvent) -> JumpPlan | None:
        plan = self.base.plan(event)
        text = plan.text() if plan is not None else None
        if plan is None or not text:
            return None
        self.counts["jumps"] += 1
        key = f"{self.seed}|{len(event.context_text)}|{event.context_text[-2048:]}|{event.call_text}|{text}"
        rng = random.Random(hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest())
        if rng.random() >= self.rate:
            return plan
        self.counts["perturbed"] += 1
        options = self._options(plan, event)
        if not options:
            plan.label = f"mistaken none (no perturbation applies) | {plan.label}"
            return plan
        kind = rng.choice(sorted(options))
        self.counts[kind] += 1
        return options[kind](rng)

    def _options(self, plan: JumpPlan, event: BoundaryEvent) -> dict[str, Any]:
        """The perturbations that apply to this plan: kind -> (rng -> perturbed plan)."""
        if plan.call is None or not plan.items:
            return {}
        values = dict(plan.items)
        partial = plan.call.partial if plan.call.stage == "string" else ""
        current = plan.items[0][0] if plan.call.stage in ("string", "after_key", "after_colon", "key") else None

        def keeps(key: str, value: str) -> bool:  # a value being written keeps its prefix
            return key != current or value.startswith(partial)

        def variant(key: str, value: Any, label: str) -> JumpPlan:
            p = copy.copy(plan)
            p.items = [(k, value if k == key else v) for k, v in plan.items]
            p.fixed_text, p.label = None, f"mistaken {label} | {plan.label}"
            return p

        out: dict[str, Any] = {}
        path_key = plan.roles.path_key if plan.roles else None
        if path_key in values and isinstance(values[path_key], str):
            here = values[path_key]
            paths = [p for p in paths_in(event.context_text + "\n" + event.output_text)
                     if not names_path(p, here) and keeps(path_key, p)]
            if paths:
                out["wrong_path"] = lambda rng: variant(path_key, (o := rng.choice(paths)), f"wrong_path {here} -> {o}")
        content_keys = plan.content_keys or [k for k in (*CONTENT_KEYS, *NEW_KEYS) if k in values]
        ckey = next((k for k in content_keys if isinstance(values.get(k), str)), None)
        if ckey is not None:
            value = values[ckey]
            low = len(partial) + 1 if ckey == current else 1
            if len(value) - low >= 1:
                def truncated(rng: random.Random) -> JumpPlan:
                    cut = rng.randint(low, len(value) - 1)
                    return variant(ckey, value[:cut], f"truncated {ckey} {len(value)} -> {cut} chars")
                out["truncated"] = truncated
            contents = [t for t in self._contents(event) if t != value and keeps(ckey, t)]
            if contents:
                out["wrong_file"] = lambda rng: variant(ckey, (o := rng.choice(contents)),
                                                        f"wrong_file {ckey} <- another content of {len(o)} chars")
        return out

    def _contents(self, event: BoundaryEvent) -> list[str]:
        """Other file contents the context shows: stated blocks, tool results, earlier
        calls' content arguments (in order of appearance, distinct)."""
        idx = self.index(event.context_text)
        cut = event.output_text.rfind(self.start)
        scope = event.output_text[:cut] if cut >= 0 else event.output_text
        found = [b.text for b in idx.blocks + blocks_in(scope) if b.closed and b.text.strip()]
        found += [m.group(1) for m in _TOOL_RESPONSE.finditer(event.context_text) if m.group(1).strip()]
        for call in idx.calls + calls_in(scope, self.start, self.end, self.family):
            found += [v for k, v in call.arguments.items() if k in (*CONTENT_KEYS, *NEW_KEYS) and isinstance(v, str)]
        return list(dict.fromkeys(found))
