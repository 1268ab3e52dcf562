"""Record -> import -> forced replay, end to end on the real default model.

Three agent sessions go through the real server with a trace recorder (`serve
--trace-dir`): OpenAI chat completions, Anthropic messages and OpenAI Responses, each
through its official SDK, streaming and not, three turns each: a named `read_file`
call, a named `write_file` call after the file's content came back as a tool result
(copyable text: echo has something to copy), and a short text answer. The server
runs strict fill, echo and n-gram proposals. Each trace file is re-imported
(traces.formats) and its turns are replayed (traces.replay) under `ordinary` and
under the methods the server recorded with. The oracle is the trace itself:

- the replayed prompt of every turn is the prompt the server rendered from the
  recorded context (same ids, and as many as the trace says);
- `ordinary` emits exactly the recorded output ids, one sampled token each;
- the recorded methods emit the same ids with the same provenance, position by
  position: the same supplied runs (kind, position, length) and counts per kind.

Two causes made a replay differ from its record, both fixed at their cause:
- replay forced the answer re-rendered from its text, whose canonical tokenization
  is not what the model emitted (under a grammar the model writes `<` then
  `tool_call>`, strict fill appends grammar tokens); a turn cut by max_tokens has no
  EOS. Replay now forces the recorded ids (traces/recorded.py).
- the trace importer dropped the request's tool choice, so a replayed turn ran
  without the grammar the server constrained it with (fewer strict tokens). The
  importer keeps it per turn and Session.turn asks with it.
The proposers are sized without the cost model (`cost_aware=False`, recording and
replay alike): with it, a proposal's length depends on measured round times, so on a
busy machine echo may propose a different split of the same tokens (same ids,
other sampled/echo counts). That is timing, not a recording fault.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.core.prompt import render_prompt
from jumpahead.traces.arms import parse_arm, parse_arms
from jumpahead.traces.formats import load_session, load_sessions
from jumpahead.traces.recorder import TraceRecorder
from jumpahead.traces.replay import ReplayOptions, plan_session, replay
from jumpahead.traces.trace_file import read_trace
from jumpahead.traces.turn_json import turn_from_json

from .serving import serve

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow  # 9 recorded turns, then 2 arms x 9 forced turns (~1-2 min quiet)

METHODS = ["strict", "echo", "ngram"]
FILE = 'def sub(a, b):\n    """Return a - b."""\n    return a - b\n'
TASK = "Read calc.py, then write it back unchanged."
PATH = {"type": "string", "enum": ["calc.py", "calc_copy.py"]}  # the weak model writes a known path
READ = {"name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": PATH}, "required": ["path"]}}
WRITE = {"name": "write_file", "description": "Write a file",
         "parameters": {"type": "object", "required": ["path", "content"],
                        "properties": {"path": PATH, "content": {"type": "string", "maxLength": 32}}}}
ASK = {"methods": METHODS}


def _chat_session(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-x", max_retries=0, timeout=600)
    tools = [{"type": "function", "function": t} for t in (READ, WRITE)]
    extra = {"jumpahead": {**ASK, "session": "rt-chat"}}
    msgs: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    r1 = client.chat.completions.create(model="m", messages=msgs, tools=tools, temperature=0, max_tokens=48,
                                        tool_choice={"type": "function", "function": {"name": "read_file"}},
                                        extra_body=extra)
    m1 = r1.choices[0].message
    msgs += [m1.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": m1.tool_calls[0].id, "content": FILE}]
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(model="m", messages=msgs, tools=tools, temperature=0, max_tokens=64,
                                                tool_choice={"type": "function", "function": {"name": "write_file"}},
                                                extra_body=extra, stream=True):
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
    (call,) = calls.values()
    msgs += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
             {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]
    client.chat.completions.create(model="m", messages=msgs, tools=tools, temperature=0, max_tokens=8,
                                   extra_body=extra)


def _messages_session(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-x", max_retries=0, timeout=600,
                                 default_headers={"X-Claude-Code-Session-Id": "rt-messages"})
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in (READ, WRITE)]
    extra = {"temperature": 0, "jumpahead": ASK}
    msgs: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    with client.messages.stream(model="m", max_tokens=48, messages=msgs, tools=tools, extra_body=extra,
                                tool_choice={"type": "tool", "name": "read_file"}) as stream:
        first = stream.get_final_message()
    use = next(b for b in first.content if b.type == "tool_use")
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": FILE}]}]
    second = client.messages.create(model="m", max_tokens=64, messages=msgs, tools=tools, extra_body=extra,
                                    tool_choice={"type": "tool", "name": "write_file"})
    use = next(b for b in second.content if b.type == "tool_use")
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}]}]
    with client.messages.stream(model="m", max_tokens=8, messages=msgs, tools=tools, extra_body=extra) as stream:
        stream.get_final_message()


def _responses_session(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-x", max_retries=0, timeout=600,
                           default_headers={"session_id": "rt-responses"})
    tools = [{"type": "function", **t} for t in (READ, WRITE)]
    extra = {"jumpahead": ASK}
    items: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    r1 = client.responses.create(model="m", input=items, tools=tools, temperature=0, max_output_tokens=48,
                                 tool_choice={"type": "function", "name": "read_file"}, extra_body=extra)
    (c1,) = [i for i in r1.output if i.type == "function_call"]
    items += [{"type": "function_call", "call_id": c1.call_id, "name": c1.name, "arguments": c1.arguments},
              {"type": "function_call_output", "call_id": c1.call_id, "output": FILE}]
    events = list(client.responses.create(model="m", input=items, tools=tools, temperature=0, max_output_tokens=64,
                                          tool_choice={"type": "function", "name": "write_file"}, extra_body=extra,
                                          stream=True))
    (c2,) = [i for i in events[-1].response.output if i.type == "function_call"]
    items += [{"type": "function_call", "call_id": c2.call_id, "name": c2.name, "arguments": c2.arguments},
              {"type": "function_call_output", "call_id": c2.call_id, "output": "ok"}]
    client.responses.create(model="m", input=items, tools=tools, temperature=0, max_output_tokens=8, extra_body=extra)


SESSIONS = {"rt-chat": ("chat", _chat_session), "rt-messages": ("messages", _messages_session),
            "rt-responses": ("responses", _responses_session)}


@pytest.fixture(scope="module")
def recorded(loaded_model, tmp_path_factory):
    """{session id: trace file}: the three sessions recorded through the real server."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    directory = tmp_path_factory.mktemp("roundtrip-traces")
    engine = Engine(model, tokenizer, info, EngineConfig(max_batch=2, cost_aware=False, prefix_cache_ssd=False))
    recorder = TraceRecorder.for_engine(directory, engine)
    try:
        with serve(engine, hooks=[recorder]) as url:
            for _, run in SESSIONS.values():
                run(url)
    finally:
        recorder.close()
        engine.close()
    return {sid: directory / f"{sid}.jsonl" for sid in SESSIONS}


@pytest.fixture(scope="module")
def replayed(recorded, loaded_model):
    """The re-imported sessions, replayed under ordinary and the recorded methods."""
    sessions = [load_session(recorded[sid]) for sid in SESSIONS]
    arms = parse_arms(["ordinary", "+".join(METHODS)])
    options = ReplayOptions(arms, turns=None, max_context=None, max_output_tokens=None, cost_aware=False)
    warnings: list[str] = []
    doc = replay(sessions, options, loaded_model, warn=warnings.append)
    return sessions, options, doc, warnings


def _turns(path) -> list[dict[str, Any]]:
    header, turns, warnings = read_trace(path)
    assert warnings == [] and header["format"] == "jumpahead-trace"
    return turns


def _ids(turn: dict[str, Any]) -> list[int]:
    return [t for run in turn["response"]["runs"] for t in run["tokens"]]


def _kinds(turn: dict[str, Any]) -> Counter:
    counts: Counter = Counter()
    for run in turn["response"]["runs"]:
        counts[run["kind"]] += len(run["tokens"])
    return counts


def _supplied(turn: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(kind, first output position, length) of each stretch of non-sampled tokens."""
    kinds = [run["kind"] for run in turn["response"]["runs"] for _ in run["tokens"]]
    out, pos = [], 0
    while pos < len(kinds):
        end = pos
        while end < len(kinds) and kinds[end] == kinds[pos]:
            end += 1
        if kinds[pos] != "sampled":
            out.append((kinds[pos], pos, end - pos))
        pos = end
    return out


def test_recorded_sessions_reimport(recorded):
    for sid, (protocol, _) in SESSIONS.items():
        turns = _turns(recorded[sid])
        assert [t["protocol"] for t in turns] == [protocol] * 3
        assert [t["methods"] for t in turns] == [METHODS] * 3
        assert [t["context"]["tool_choice"]["mode"] for t in turns] == ["function", "function", "auto"]
        streamed = [bool(t["request"]["body"].get("stream")) for t in turns]
        assert True in streamed and False in streamed
        (session,) = load_sessions(recorded[sid])
        assert session.id == sid and session.format == "jumpahead"
        assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        answers = [m for m in session.messages if m.role == "assistant"]
        assert [m.meta["turn_index"] for m in answers] == [0, 1, 2]
        assert [[c.name for c in m.tool_calls] for m in answers] == [["read_file"], ["write_file"], []]
        assert session.messages[2].content == FILE and session.messages[2].tool_call_id == answers[0].tool_calls[0].id
        assert json.loads(turns[1]["response"]["tool_calls"][0]["arguments"]) == answers[1].tool_calls[0].args
        for m, t in zip(answers, turns):
            assert m.meta["runs"] == t["response"]["runs"] and m.meta["methods"] == METHODS
            assert m.meta["tool_choice"] == t["context"]["tool_choice"]
        # the session's own tool choice comes back on the replayed request
        assert [session.turn(i).tool_choice.name for i in (1, 3)] == ["read_file", "write_file"]
        # copyable content made it into the answers: echo supplied tokens somewhere
    assert sum(_kinds(t)["echo"] for sid in SESSIONS for t in _turns(recorded[sid])) > 0
    assert all(_kinds(t)["strict"] > 0 for sid in SESSIONS for t in _turns(recorded[sid])[:2])


def test_replayed_prompts_are_the_recorded_ones(recorded, replayed, loaded_model):
    _, tokenizer, _ = loaded_model
    sessions, options, _, _ = replayed
    for session in sessions:
        turns = _turns(recorded[session.id])
        planned, skipped, window = plan_session(session, tokenizer, 8192, options)
        assert skipped == [] and window is None and [p.index for p in planned] == [1, 3, 5]
        for plan, turn in zip(planned, turns):
            expected = render_prompt(tokenizer, turn_from_json(turn["context"]))
            assert plan.prompt == expected and len(plan.prompt) == turn["prompt_tokens"], (session.id, plan.index)
            assert plan.tokens == _ids(turn)  # the forced output is the recorded ids, not a re-rendering


def test_ordinary_replay_reproduces_the_recorded_tokens(recorded, replayed):
    _, _, doc, warnings = replayed
    assert warnings == [] and doc["warnings"] == []
    by_id = {s["id"]: s for s in doc["sessions"]}
    for sid in SESSIONS:
        turns = _turns(recorded[sid])
        out = by_id[sid]
        assert out["turns_total"] == 3 and out["turns_replayed"] == 3 and out["tools"] == "recorded"
        for entry, turn in zip(out["turns"], turns):
            ordinary = entry["arms"]["ordinary"]
            n = len(_ids(turn))
            assert n == turn["usage"]["completion_tokens"] == entry["output_tokens"]
            assert ordinary["identical"] and not ordinary["diverged"], (sid, entry["index"])
            assert ordinary["tokens_by_kind"] == {"sampled": n}
            # every token after the first (the prefill's) is one decode round
            assert ordinary["rounds"] == n - 1


def test_recorded_methods_reproduce_the_recorded_provenance(recorded, replayed):
    _, _, doc, _ = replayed
    name = parse_arm("+".join(METHODS)).name
    by_id = {s["id"]: s for s in doc["sessions"]}
    for sid in SESSIONS:
        for entry, turn in zip(by_id[sid]["turns"], _turns(recorded[sid])):
            arm = entry["arms"][name]
            assert arm["identical"] and not arm["diverged"], (sid, entry["index"])
            assert Counter(arm["tokens_by_kind"]) == _kinds(turn) == Counter(turn["usage"]["fill"]["tokens"]), \
                (sid, entry["index"])
            supplied = [i for i in arm["interventions"] if i["kind"] != "unaccepted"]
            assert [(i["kind"], i["at"], i["tokens"]) for i in supplied] == _supplied(turn), (sid, entry["index"])
            # rounds whose proposals were all rejected are priced as one item that supplied nothing
            idle = [i for i in arm["interventions"] if i["kind"] == "unaccepted"]
            assert len(idle) <= 1 and all(i["tokens"] == 0 and i["at"] is None and i["rounds"] > 0 for i in idle)
            assert arm["rounds"] == turn["usage"]["fill"]["rounds"], (sid, entry["index"])
