"""The policy runtime through the real HTTP server, the real model and the real SDKs.

User policies are loaded from "module:Class" out of a module written into tmp_path:
an on_request rewrite of the system prompt, a boundary policy that asserts the rest
of a tool call as jump tokens, a policy that raises, a session counter. Also: spec and
TOML parsing, CLI errors (exit 2), request specs (400), and that the engine state
after a jump equals a fresh forward over the same tokens (greedy continuation oracle).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.policies.registry import PolicyError, PolicySpec, load_config, parse_spec, resolve, spec_from_object

from .oracle import assert_same_or_near_tie
from .serving import free_port, interrupt, serve

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

MODULE = "ja_test_user_policies"
SYSTEM = "You are a weather assistant. Answer in one short sentence. " * 6
CITY, UNIT = "Paris", "celsius"
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                          "required": ["city", "unit"]}}

POLICIES = textwrap.dedent('''
    import dataclasses, json
    from jumpahead.policies import Intervention, Policy
    from jumpahead.core.turn import Message

    class SystemRewrite(Policy):
        """Replaces the system prompt; reports the rewritten prompt's token count."""
        name = "sysrewrite"

        def __init__(self, text="Be brief.", **options):
            super().__init__(text=text, **options)
            self.text = text

        def on_request(self, ctx):
            rest = [m for m in ctx.turn.messages if m.role != "system"]
            turn = dataclasses.replace(ctx.turn, messages=[Message("system", self.text), *rest])
            ctx.notes.append({"kind": "rewrite", "prompt_tokens": ctx.count_tokens(turn)})
            return turn

    class CallJump(Policy):
        """At the first boundary inside a tool call whose text is a prefix of the call
        it wants, asserts the rest of that call (and its end marker) as jump tokens."""
        name = "calljump"

        def __init__(self, city="Paris", unit="celsius", close="true", verified="false", **options):
            super().__init__(**options)
            self.arguments = {"city": city, "unit": unit}
            self.close = close == "true"
            self.verified = verified == "true"
            self.seen = []

        def on_boundary(self, event):
            self.seen.append(event.boundary)
            if event.boundary not in ("tool_call_opened", "tool_name", "argument_key") or "jumped" in self.seen:
                return None
            call = "\\n" + json.dumps({"name": "get_weather", "arguments": self.arguments})
            if call.startswith(event.call_text):
                self.seen.append("jumped")
                rest = call[len(event.call_text):] + ("\\n</tool_call>" if self.close else "")
                return Intervention(text=rest, label="weather call", verified=self.verified)
            return None

        def on_result(self, result):
            result.session.memo["calljump_seen"] = list(self.seen)

    class Copier(Policy):
        """At the call's opening, copies the JSON call line the user wrote, with its source span."""
        name = "copier"

        def on_tool_call_opened(self, event):
            start = event.context_text.rfind('\\n{"name"')  # the call as the grammar wants it: after a newline
            end = event.context_text.find("}}", start) + 2
            if start < 0 or end < 2 or not event.context_text[start:end].startswith(event.call_text):
                return None
            start += len(event.call_text)  # what the model already wrote of it
            return Intervention(text=event.context_text[start:end], source=(start, end), label="copied call")

    class Opener(Policy):
        """Offers a proposer that asserts the tool-call start marker as the first tokens."""
        name = "opener"

        def proposers(self, ctx):
            return [_Opener(ctx.tokenizer.encode("<tool_call>", add_special_tokens=False))]

    class _Opener:
        name = "opener"

        def __init__(self, tokens):
            self.tokens = list(tokens)

        def propose(self, view, max_len):
            from jumpahead.engine.methods.proposal import Proposal
            out = list(view.tokens[view.prompt_len:])
            if out == self.tokens[:len(out)] and len(out) < len(self.tokens):
                return Proposal(self.tokens[len(out):], "jump")
            return None

        def feedback(self, proposal, accepted):
            pass

    class Raiser(Policy):
        name = "raiser"

        def __init__(self, where="on_request", **options):
            super().__init__(**options)
            self.where = where

        def on_request(self, ctx):
            if self.where == "on_request":
                raise RuntimeError("boom in on_request")

        def on_boundary(self, event):
            if self.where == "on_boundary":
                raise RuntimeError("boom in on_boundary")

    class Counter(Policy):
        name = "counter"

        def __init__(self, step="1"):  # no **options: an unknown option is an error
            super().__init__(step=step)
            self.step = int(step)

        def on_request(self, ctx):
            ctx.session.memo["n"] = ctx.session.memo.get("n", 0) + self.step
            ctx.notes.append({"kind": "count", "n": ctx.session.memo["n"], "requests": ctx.session.requests})

    class Writer(Policy):
        """Asks the serving model for text (RequestContext.generate)."""
        name = "writer"

        def on_request(self, ctx):
            ctx.notes.append({"kind": "generated", "text": ctx.generate("Say hello.", 4)})

    class DuckTyped:
        """Not a Policy subclass: only a hook."""
        def __init__(self, **options):
            self.options = options

        def on_request(self, ctx):
            ctx.notes.append({"kind": "duck", "options": self.options})

    NotAPolicy = dict
''')


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("user-policies")
    (d / f"{MODULE}.py").write_text(POLICIES)
    sys.path.insert(0, str(d))
    importlib.invalidate_caches()
    yield d
    sys.path.remove(str(d))
    sys.modules.pop(MODULE, None)


def _hooks(engine, *specs, **kwargs):
    from jumpahead.policies.runtime import PolicyHooks, engine_generator

    return PolicyHooks(list(specs), engine.tokenizer, engine.context_length, engine_generator(engine), **kwargs)


class Capture:
    """A hook after the policies: what the row was given and what it emitted."""

    def __init__(self):
        self.turns = []

    def before_render(self, exchange, turn):
        return turn

    def row_proposers(self, exchange, prepared):
        return []

    def after_turn(self, exchange, prepared, out):
        self.turns.append({"prompt": list(prepared.request.prompt), "tokens": list(prepared.output_tokens),
                           "kinds": list(prepared.output_kinds), "sources": list(prepared.output_sources),
                           "notes": dict(exchange.notes), "out": out})


def _fill(usage) -> dict:
    extra = getattr(usage, "model_extra", None) or {}
    return extra.get("fill") or getattr(usage, "fill", None)


def _report(usage) -> dict | None:
    """`usage.report`: the policies' report, beside the engine's telemetry in `usage.fill`."""
    extra = getattr(usage, "model_extra", None) or {}
    return extra.get("report")


def _both(usage) -> dict:
    return {**(_fill(usage) or {}), **(_report(usage) or {})}


# --- specs and config (no model) ----------------------------------------------------


def test_specs_parse_and_name_what_is_wrong(policy_dir):
    spec = parse_spec(f"{MODULE}:SystemRewrite:text=hi there,x_y=1")
    assert (spec.target, spec.options) == (f"{MODULE}:SystemRewrite", {"text": "hi there", "x_y": "1"})
    assert parse_spec("compaction:clear_at_least=2000").options == {"clear_at_least": "2000"}
    policy = resolve(f"{MODULE}:SystemRewrite:text=short")
    assert policy.text == "short" and policy.options == {"text": "short"}
    assert resolve(f"{MODULE}:DuckTyped:a=1").options == {"a": "1"}
    obj = spec_from_object({"name": f"{MODULE}:CallJump", "city": "Rome", "close": False})
    assert obj.options == {"city": "Rome", "close": "false"}
    for bad, words in [("nope", "unknown policy 'nope'"), ("nope:a=1", "unknown policy 'nope'"),
                       ("no_such_module_xyz:Cls", "cannot import module 'no_such_module_xyz'"),
                       (f"{MODULE}:Missing", f"module '{MODULE}' has no 'Missing'"),
                       (f"{MODULE}:NotAPolicy", "neither a Policy subclass"),
                       (f"{MODULE}:SystemRewrite:novalue", "is not key=value"),
                       (f"{MODULE}:Counter:bogus=1", "bad options"), ("", "empty policy spec")]:
        with pytest.raises(PolicyError, match=words.replace("(", r"\(")):
            resolve(bad)


def test_toml_config(tmp_path, policy_dir):
    cfg = tmp_path / "policies.toml"
    cfg.write_text(f'[[policy]]\nname = "{MODULE}:SystemRewrite"\ntext = "From TOML, with, commas."\n\n'
                   f'[[policy]]\nname = "{MODULE}:CallJump"\nclose = false\ncity = "Rome"\n')
    specs = load_config(cfg)
    assert [s.name for s in specs] == [f"{MODULE}:SystemRewrite", f"{MODULE}:CallJump"]
    assert specs[0].build().text == "From TOML, with, commas."
    assert specs[1].options == {"close": "false", "city": "Rome"}
    for text, words in [("[[policy]]\nname = 3\n", "policy 1"), ("[[policy]\n", "not valid TOML"),
                        ("[other]\nx = 1\n", "unknown top-level keys")]:
        cfg.write_text(text)
        with pytest.raises(PolicyError, match=words):
            load_config(cfg)
    with pytest.raises(PolicyError, match="cannot read policy config"):
        load_config(tmp_path / "missing.toml")


def _serve_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "serve", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_bad_policy_flags_exit_2(tmp_path, policy_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(policy_dir), os.environ.get("PYTHONPATH", "")])}
    for args, words in [(["--policy", "nope"], "unknown policy 'nope'"),
                        (["--policy", "no_such_module_xyz:Cls"], "cannot import module 'no_such_module_xyz'"),
                        (["--policy", f"{MODULE}:Missing"], "has no 'Missing'"),
                        (["--policy", f"{MODULE}:Counter:bogus=1"], "bad options"),
                        (["--policy-config", str(tmp_path / "missing.toml")], "cannot read policy config")]:
        out = _serve_cli(*args, env=env)
        assert out.returncode == 2 and words in out.stderr, (args, out.stderr[-500:])
        assert "Traceback" not in out.stderr
    out = _serve_cli("--help")
    assert "--policy NAME[:key=value,...]" in out.stdout and "--policy-config FILE.toml" in out.stdout


# --- the real server -------------------------------------------------------------------


def _chat(url, **kwargs):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0).chat.completions.create(
        model="m", temperature=0, **kwargs)


def _messages(url, **kwargs):
    extra = {"temperature": 0, **kwargs.pop("extra_body", {})}
    return anthropic.Anthropic(base_url=url, api_key="x", max_retries=0).messages.create(
        model="m", extra_body=extra, **kwargs)


def _responses(url, **kwargs):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0).responses.create(
        model="m", temperature=0, **kwargs)


def test_on_request_rewrite_in_all_protocols(engine, policy_dir):
    hooks = _hooks(engine, f"{MODULE}:SystemRewrite:text=Be brief.", allow_request_user_policies=False)
    capture = Capture()
    with serve(engine, hooks=[hooks, capture]) as url:
        user = [{"role": "user", "content": "Hi"}]
        chat = _chat(url, messages=[{"role": "system", "content": SYSTEM}, *user], max_tokens=3)
        msg = _messages(url, system=SYSTEM, messages=user, max_tokens=3)
        resp = _responses(url, instructions=SYSTEM, input="Hi", max_output_tokens=3)
        # the same request without the server's policy: the client's long system prompt
        plain = _chat(url, messages=[{"role": "system", "content": SYSTEM}, *user], max_tokens=3,
                      extra_body={"jumpahead": {"policies": [], "replace": True}})
        # a request-level policy adds to the server's
        added = _chat(url, messages=user, max_tokens=3,
                      extra_body={"jumpahead": {"policies": [f"{MODULE}:SystemRewrite:text=Be very brief please."]}})
        metrics = httpx.get(f"{url}/metrics.json", timeout=30).json()
    fills = [_report(chat.usage), _report(msg.usage), _report(resp.usage)]
    prompts = [chat.usage.prompt_tokens, msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0),
               resp.usage.input_tokens]
    for fill, prompt_tokens in zip(fills, prompts):
        policies = fill["policies"]
        assert policies["active"] == ["sysrewrite"]
        (note,) = policies["interventions"]
        assert note["boundary"] == "request" and note["kind"] == "rewrite"
        assert note["prompt_tokens"] == prompt_tokens  # the model saw the rewritten prompt
        assert policies["by_policy"]["sysrewrite"]["on_request_ms"] > 0
    assert plain.usage.prompt_tokens > chat.usage.prompt_tokens + 40  # the long system prompt is back
    for usage in (chat.usage, msg.usage, resp.usage):  # usage.fill is the engine's telemetry only
        assert not {"policies", "context_edits"} & set(_fill(usage) or {})
    assert _report(plain.usage) is None and "policies" not in (_fill(plain.usage) or {})
    assert [c["notes"]["policies"]["active"] for c in capture.turns[:3]] == [["sysrewrite"]] * 3
    added_fill = _report(added.usage)["policies"]
    assert added_fill["active"] == ["sysrewrite", "sysrewrite#2"]
    assert added_fill["interventions"][-1]["prompt_tokens"] == added.usage.prompt_tokens
    section = metrics["policies"]
    assert section["requests"] == 4 and section["interventions"]["sysrewrite"]["rewrite"] == 4
    assert section["server"] == [f"{MODULE}:SystemRewrite:text=Be brief."]


WEATHER_CHAT = {"type": "function", "function": WEATHER}
WEATHER_MSG = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
WEATHER_RESP = {"type": "function", **WEATHER}
NO_STRICT = {"jumpahead": {"methods": ["none"]}}  # grammar still masks; the boundary proposer is asked every round


def _call_args_by_protocol(url, city):
    user = [{"role": "user", "content": f"What is the weather in {city}?"}]
    chat = _chat(url, messages=user, max_tokens=120, tools=[WEATHER_CHAT], tool_choice="required",
                 extra_body=NO_STRICT)
    msg = _messages(url, messages=user, max_tokens=120, tools=[WEATHER_MSG],
                    tool_choice={"type": "tool", "name": "get_weather"}, extra_body=NO_STRICT)
    resp = _responses(url, input=user[0]["content"], max_output_tokens=120, tools=[WEATHER_RESP],
                      tool_choice="required", extra_body=NO_STRICT)
    out = []
    (call,) = chat.choices[0].message.tool_calls
    out.append((call.function.name, json.loads(call.function.arguments), _both(chat.usage), chat.choices[0].finish_reason))
    (block,) = [b for b in msg.content if b.type == "tool_use"]
    out.append((block.name, block.input, _both(msg.usage), msg.stop_reason))
    (item,) = [i for i in resp.output if i.type == "function_call"]
    out.append((item.name, json.loads(item.arguments), _both(resp.usage), resp.status))
    return out


def test_boundary_jump_completes_a_tool_call_in_all_protocols(engine, policy_dir):
    # A long value: the jump is longer than the round's asserted cap (64), so it
    # continues across rounds on a grammar-constrained row.
    city = "Paris " * 40
    hooks = _hooks(engine, PolicySpec(f"{MODULE}:CallJump", f"{MODULE}:CallJump", {"city": city.strip(), "unit": UNIT}))
    capture = Capture()
    with serve(engine, hooks=[hooks, capture]) as url:
        results = _call_args_by_protocol(url, "Paris")
        metrics = httpx.get(f"{url}/metrics.json", timeout=30).json()
    for (name, arguments, fill, finish), turn in zip(results, capture.turns):
        assert name == "get_weather" and arguments == {"city": city.strip(), "unit": UNIT}, finish
        policies = fill["policies"]
        (iv,) = policies["interventions"]
        assert iv["policy"] == "calljump" and iv["kind"] == "jump" and iv["boundary"] == "tool_call_opened"
        assert iv["tokens"] > 64 and iv["emitted"] == iv["tokens"] and iv["label"] == "weather call"
        assert fill["tokens"]["jump"] == iv["tokens"] == turn["kinds"].count("jump")
        # the jump tokens are one contiguous run right where the policy decided
        assert turn["kinds"][iv["at"]:iv["at"] + iv["tokens"]] == ["jump"] * iv["tokens"]
        assert policies["by_policy"]["calljump"]["on_boundary_ms"] > 0 and policies["h_ms"] > 0
        assert policies["supplied_tokens"] == iv["tokens"]
        assert turn["notes"]["interventions"] == policies["interventions"]
    section = metrics["policies"]
    assert section["interventions"]["calljump"]["jump"] == 3
    assert section["tokens_supplied"] == sum(r[2]["policies"]["interventions"][0]["tokens"] for r in results)
    assert metrics["engine"]["tokens_jump"] >= section["tokens_supplied"]


def test_boundaries_fire_once_with_strict_fill_on(engine, policy_dir):
    """With strict proposers on, forced text comes first: the boundaries still fire,
    each once, in order, and the answer is a well-formed call."""
    hooks = _hooks(engine, f"{MODULE}:CallJump")
    with serve(engine, hooks=[hooks]) as url:
        chat = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0).chat.completions.create(
            model="m", temperature=0, max_tokens=60, tools=[WEATHER_CHAT], tool_choice="required",
            messages=[{"role": "user", "content": "Weather in Oslo?"}], extra_headers={"x-session-id": "strict-on"})
        memo = hooks.sessions.get("strict-on").memo
    (call,) = chat.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city", "unit"}
    seen = memo["calljump_seen"]
    if "jumped" in seen:  # the model's first value token happened to fit the policy's call
        assert seen[0] == "tool_call_opened" and seen[-1] == "turn_end" and seen.count("turn_end") == 1
    else:
        assert seen == ["tool_call_opened", "tool_name", "argument_key", "argument_key", "turn_end"]


def test_engine_state_after_a_jump_equals_a_fresh_forward(engine, loaded_model, policy_dir):
    """An asserted jump mid-answer (no grammar): the greedy continuation after it equals
    a fresh run whose prompt is the prompt plus the output up to the jump's end."""
    from jumpahead.engine.types import GenerationRequest

    hooks = _hooks(engine, f"{MODULE}:Opener", f"{MODULE}:CallJump:close=false,city=Par")
    capture = Capture()
    with serve(engine, hooks=[hooks, capture]) as url:
        _chat(url, messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=40,
              tools=[WEATHER_CHAT], extra_body=NO_STRICT)
    turn = capture.turns[0]
    (iv,) = turn["notes"]["interventions"]
    end = iv["at"] + iv["tokens"]
    assert iv["emitted"] == iv["tokens"] and turn["kinds"][iv["at"]:end] == ["jump"] * iv["tokens"]
    assert turn["kinds"][:5] == ["jump"] * 5  # the opener's "<tool_call>", then one sampled token
    after = turn["tokens"][end:]
    assert len(after) >= 8 and set(turn["kinds"][end:]) == {"sampled"}
    fresh_prompt = turn["prompt"] + turn["tokens"][:end]
    chunks = engine.generate_sync(GenerationRequest(prompt=fresh_prompt, max_tokens=len(after), methods=["none"]))
    fresh = [t for c in chunks for t in c.tokens]
    assert_same_or_near_tie(loaded_model[0], fresh_prompt, after, fresh)


def test_a_raising_policy_is_disabled_and_the_request_answers(engine, policy_dir):
    hooks = _hooks(engine, f"{MODULE}:Raiser:where=on_request", f"{MODULE}:Counter",
                   f"{MODULE}:Raiser:where=on_boundary", f"{MODULE}:CallJump")
    with serve(engine, hooks=[hooks]) as url:
        user = [{"role": "user", "content": "Weather in Paris?"}]
        chat = _chat(url, messages=user, max_tokens=80, tools=[WEATHER_CHAT], tool_choice="required",
                     extra_body=NO_STRICT)
        msg = _messages(url, messages=user, max_tokens=5)
        metrics = httpx.get(f"{url}/metrics.json", timeout=30).json()["policies"]
    policies = _report(chat.usage)["policies"]
    errors = {(e["policy"], e["hook"]): e["error"] for e in policies["errors"]}
    assert errors == {("raiser", "on_request"): "RuntimeError: boom in on_request",
                      ("raiser#2", "on_boundary"): "RuntimeError: boom in on_boundary"}
    assert policies["by_policy"]["raiser"]["disabled"] and policies["by_policy"]["raiser#2"]["disabled"]
    assert policies["by_policy"]["raiser#2"]["boundary_calls"] == 1  # disabled after its first raise
    assert "disabled" not in policies["by_policy"]["counter"]
    # the policies after the raising ones still ran: the jump made the call
    (call,) = chat.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": CITY, "unit": UNIT}
    assert [i["policy"] for i in policies["interventions"]] == ["counter", "calljump"]
    # no tool call here: raiser#2's only boundary is the turn's end (observed after the row)
    msg_errors = _report(msg.usage)["policies"]["errors"]
    assert [(e["policy"], e["hook"]) for e in msg_errors] == [("raiser", "on_request"), ("raiser#2", "on_boundary")]
    assert msg.content[0].type == "text"
    assert metrics["errors"] == {"raiser": 2, "raiser#2": 2}


def test_bad_request_policies_are_400(engine, policy_dir):
    hooks = _hooks(engine, f"{MODULE}:Counter")
    with serve(engine, hooks=[hooks]) as url:
        user = [{"role": "user", "content": "Hi"}]
        cases = [(["nope"], "unknown policy 'nope'"),
                 (["os:path"], "user policy os:path is not enabled on this server"),
                 ([{"name": f"{MODULE}:Counter", "bogus": 1}], "bad options"),
                 ([f"{MODULE}:Counter:novalue"], "is not key=value"),
                 (3, "must be a list")]
        for policies, words in cases:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={"messages": user, "max_tokens": 2,
                                                               "jumpahead": {"policies": policies}})
            assert r.status_code == 400 and words in r.json()["error"]["message"], (policies, r.text)
        r = httpx.post(f"{url}/v1/messages", timeout=120, json={"model": "m", "messages": user, "max_tokens": 2,
                                                   "jumpahead": {"policies": ["nope"]}})
        assert r.status_code == 400 and r.json()["type"] == "error" and "nope" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/v1/responses", timeout=120, json={"model": "m", "input": "Hi", "max_output_tokens": 2,
                                                    "jumpahead": {"policies": ["nope"]}})
        assert r.status_code == 400 and "nope" in r.json()["error"]["message"]
        # a user class the server was started with may be named again, with options
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={"messages": user, "max_tokens": 2, "jumpahead": {
            "policies": [{"name": f"{MODULE}:Counter"}]}})
        assert r.status_code == 200 and r.json()["usage"]["report"]["policies"]["active"] == ["counter", "counter#2"]


def test_session_memo_persists_within_a_session_only(engine, policy_dir):
    hooks = _hooks(engine, f"{MODULE}:Counter", f"{MODULE}:Writer")
    with serve(engine, hooks=[hooks]) as url:
        def count(session: str, client: str) -> tuple[int, int]:
            user = [{"role": "user", "content": "Hi"}]
            if client == "chat":
                r = _chat(url, messages=user, max_tokens=2, extra_headers={"x-session-id": session})
            else:
                r = _messages(url, messages=user, max_tokens=2, extra_headers={"x-session-id": session})
            notes = {n["kind"]: n for n in _report(r.usage)["policies"]["interventions"]}
            assert notes["generated"]["text"].strip()  # the model wrote text for the policy
            return notes["count"]["n"], notes["count"]["requests"]

        assert count("session-a", "chat") == (1, 0)
        assert count("session-a", "messages") == (2, 1)
        assert count("session-b", "chat") == (1, 0)
        assert count("session-a", "chat") == (3, 2)


def test_serve_with_policy_config_and_flag(tmp_path, policy_dir, tiny_model_dir):
    """`jumpahead serve --policy-config FILE --policy SPEC` in a subprocess, the user
    module found through PYTHONPATH. (It serves conftest.py's tiny llama: what is
    checked is the policies' loading and reporting, not the answer.)"""
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[[policy]]\nname = "{MODULE}:SystemRewrite"\ntext = "Short, plain answers."\n')
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(policy_dir), os.environ.get("PYTHONPATH", "")]),
           "JUMPAHEAD_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "jumpahead.app.cli", "serve", "--port", str(port),
                             "--max-batch", "2", "--no-ssd-cache", "--no-fit", "--log-level", "warning",
                             "--model", str(tiny_model_dir),
                             "--policy-config", str(cfg), "--policy", f"{MODULE}:Counter"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        policies = r.json()["usage"]["report"]["policies"]
        assert policies["active"] == ["sysrewrite", "counter"]
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()
        assert health["policies"] == [f"{MODULE}:SystemRewrite:text=Short, plain answers.", f"{MODULE}:Counter"]
        assert httpx.get(f"http://127.0.0.1:{port}/metrics.json", timeout=30).json()["policies"]["requests"] == 1
    finally:
        interrupt(proc, timeout=30)


def test_verified_jump_keeps_ordinary_decoding(engine, loaded_model, policy_dir):
    """A verified intervention is checked token by token: the answer equals the one
    without the policy, the tokens the model agreed with are kind "jump"."""
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 60, "temperature": 0,
            "tools": [WEATHER_CHAT], "tool_choice": "required", **NO_STRICT}
    capture = Capture()
    with serve(engine, hooks=[_hooks(engine, f"{MODULE}:CallJump:verified=true,city=Paris,unit=celsius"), capture]) as url:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json=body).json()
    with serve(engine, hooks=[_hooks(engine), capture]) as url:
        plain = httpx.post(f"{url}/v1/chat/completions", timeout=300, json=body).json()
    jumped, base = capture.turns
    (iv,) = r["usage"]["report"]["policies"]["interventions"]
    assert iv["verified"] is True and iv["kind"] == "jump" and 0 < iv["emitted"] <= iv["tokens"]
    assert jumped["kinds"].count("jump") == iv["emitted"] == r["usage"]["fill"]["tokens"]["jump"]
    assert r["usage"]["fill"]["verified"]["accepted"] == iv["emitted"]
    assert_same_or_near_tie(loaded_model[0], base["prompt"], jumped["tokens"], base["tokens"])
    assert r["choices"][0]["message"]["tool_calls"][0]["function"] == plain["choices"][0]["message"]["tool_calls"][0]["function"]


def test_jump_copied_from_the_context_carries_its_source(engine, policy_dir):
    call = json.dumps({"name": "get_weather", "arguments": {"city": "Lyon", "unit": "kelvin"}})
    capture = Capture()
    with serve(engine, hooks=[_hooks(engine, f"{MODULE}:Copier"), capture]) as url:
        chat = _chat(url, messages=[{"role": "user", "content": f"Make exactly this call:\n{call}\nThanks."}],
                     max_tokens=60, tools=[WEATHER_CHAT], tool_choice="required", extra_body=NO_STRICT)
    (tool_call,) = chat.choices[0].message.tool_calls
    assert json.loads(tool_call.function.arguments) == {"city": "Lyon", "unit": "kelvin"}
    turn = capture.turns[0]
    (iv,) = turn["notes"]["interventions"]
    a, b = iv["source_tokens"]
    assert iv["emitted"] == iv["tokens"] == b - a > 10
    # the tokens are the context's own, and each token's provenance points at its copy
    jump = slice(iv["at"], iv["at"] + iv["tokens"])
    assert turn["tokens"][jump] == turn["prompt"][a:b]
    assert turn["sources"][jump] == list(range(a, b))


def test_policies_report_in_streams(engine, policy_dir):
    hooks = _hooks(engine, f"{MODULE}:Counter")
    with serve(engine, hooks=[hooks]) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=2, stream=True, stream_options={"include_usage": True}))
        assert _report(chunks[-1].usage)["policies"]["active"] == ["counter"]
        with httpx.stream("POST", f"{url}/v1/messages", timeout=300, json={
                "model": "m", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}) as r:
            text = "".join(r.iter_text())
        delta = next(json.loads(line[6:]) for line in text.splitlines()
                     if line.startswith("data: ") and '"message_delta"' in line)
        assert delta["usage"]["report"]["policies"]["active"] == ["counter"]
        with httpx.stream("POST", f"{url}/v1/responses", timeout=300, json={
                "model": "m", "max_output_tokens": 2, "stream": True, "input": "Hi"}) as r:
            text = "".join(r.iter_text())
        done = next(json.loads(line[6:]) for line in text.splitlines()
                    if line.startswith("data: ") and ('"response.completed"' in line or '"response.incomplete"' in line))
        assert done["response"]["usage"]["report"]["policies"]["active"] == ["counter"]
