"""Session importers: the public sessions in ../shared/traces/public and samples written
here in each format's documented shape. Counts are taken from the raw files by this
test's own JSON walking, never by the importers' code. No model is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from jumpahead.traces.formats import UnknownFormat, known_formats, load_sessions
from jumpahead.traces.session import Session

from .conftest import shared_path

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / ".venv" / "bin" / "jumpahead"
if not CLI.exists():
    CLI = Path(sys.executable).parent / "jumpahead"

ALL_FORMATS = ["pi", "claude-code", "codex", "opencode", "mini-swe-agent", "swe-agent", "openhands-eval",
               "openhands", "cline", "openai-messages"]


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def counts(session: Session) -> dict[str, int]:
    return {"turns": session.turns, "tool_calls": session.tool_call_count,
            "tool_results": sum(1 for m in session.messages if m.role == "tool"),
            "reasoning": session.reasoning_count}


def assert_links(session: Session) -> None:
    """Every tool result answers a call made earlier in the same session, at most once."""
    seen: set[str] = set()
    answered: Counter[str] = Counter()
    for m in session.messages:
        if m.role == "assistant":
            seen.update(c.id for c in m.tool_calls)
        if m.role == "tool":
            assert m.tool_call_id, f"tool result without a call id in {session.id}"
            assert m.tool_call_id in seen, f"{m.tool_call_id} answers no earlier call in {session.id}"
            answered[m.tool_call_id] += 1
    assert not [k for k, n in answered.items() if n > 1]


def roundtrip(session: Session) -> None:
    again = Session.from_dict(orjson.loads(orjson.dumps(session.to_dict())))
    assert again == session
    assert again.to_dict() == session.to_dict()


# ----------------------------------------------------------------- public sessions


def public_session(*parts: str) -> tuple[Session, Any]:
    """The one session of ../shared/traces/public/PARTS, and the file's JSON as written."""
    path = shared_path("traces", "public", *parts)
    [s] = load_sessions(path)
    return s, json.loads(path.read_text())

def raw_pi(path: Path) -> dict[str, Any]:
    msgs = [e["message"] for e in jsonl(path) if e.get("type") == "message"]
    assistants = [m for m in msgs if m["role"] == "assistant"]
    return {"turns": len(assistants),
            "tool_calls": sum(1 for m in assistants for b in m["content"] if b["type"] == "toolCall"),
            "tool_results": sum(1 for m in msgs if m["role"] == "toolResult"),
            "reasoning": sum(1 for m in assistants
                             if any(b["type"] == "thinking" and b["thinking"].strip() for b in m["content"])),
            "models": {m["model"] for m in assistants}}


def raw_claude(rows: list[dict[str, Any]]) -> dict[str, Any]:
    blocks_by_id: dict[str, list[dict[str, Any]]] = {}
    models = set()
    results = 0
    for r in rows:
        if r.get("type") == "assistant":
            blocks_by_id.setdefault(r["message"]["id"], []).extend(r["message"]["content"])
            models.add(r["message"]["model"])
        elif r.get("type") == "user" and isinstance(r["message"]["content"], list):
            results += sum(1 for b in r["message"]["content"] if b.get("type") == "tool_result")
    return {"turns": len(blocks_by_id),
            "tool_calls": sum(1 for bs in blocks_by_id.values() for b in bs if b["type"] == "tool_use"),
            "tool_results": results,
            "reasoning": sum(1 for bs in blocks_by_id.values()
                             if any(b["type"] == "thinking" and b["thinking"].strip() for b in bs)),
            "models": models}


def test_pi_public_session() -> None:
    path = shared_path("traces", "public", "pi", "before-compaction.jsonl")
    [s] = load_sessions(path)
    raw = raw_pi(path)
    assert s.format == "pi" and s.id == jsonl(path)[0]["id"]
    assert counts(s) == {k: raw[k] for k in ("turns", "tool_calls", "tool_results", "reasoning")}
    assert set(s.models) == raw["models"]
    assert_links(s)
    roundtrip(s)
    # the first call's arguments come through as the object pi recorded
    first = next(m for m in jsonl(path) if m.get("type") == "message" and m["message"]["role"] == "assistant")
    call = next(b for b in first["message"]["content"] if b["type"] == "toolCall")
    got = next(c for m in s.messages for c in m.tool_calls)
    assert (got.id, got.name, got.args) == (call["id"], call["name"], call["arguments"])
    # both compactions: summary messages at their place, pointing at the first kept entry
    entries = jsonl(path)
    comps = [e for e in entries if e.get("type") == "compaction"]
    summaries = [i for i, m in enumerate(s.messages) if "compaction" in m.meta]
    assert len(summaries) == len(comps) == 2
    for at, entry in zip(summaries, comps):
        assert entry["summary"] in s.messages[at].content and s.messages[at].role == "user"
        kept = s.messages[s.messages[at].meta["compaction"]["first_kept"]]
        target = entries[entry["firstKeptEntryIndex"]]["message"]
        assert kept.timestamp == entries[entry["firstKeptEntryIndex"]]["timestamp"]
        assert kept.role == {"toolResult": "tool"}.get(target["role"], target["role"])
    # a turn after the second compaction sees the summary, then the kept messages
    last = summaries[-1]
    after = next(i for i in range(last + 1, len(s.messages)) if s.messages[i].role == "assistant")
    turn = s.turn(after)
    kept_from = s.messages[last].meta["compaction"]["first_kept"]
    assert turn.messages[0].content == s.messages[last].content
    assert len(turn.messages) == 1 + (last - kept_from) + (after - last - 1)
    assert turn.messages[1].content == s.messages[kept_from].content


def test_claude_code_public_session() -> None:
    path = shared_path("traces", "public", "claude-code", "258c7280-ae70-4798-800f-63464d01a85d.jsonl")
    sessions = load_sessions(path)
    rows = jsonl(path)
    main = [r for r in rows if r.get("type") in ("user", "assistant") and not r.get("isSidechain")]
    raw = raw_claude(main)
    s = sessions[0]
    assert s.format == "claude-code" and s.id == rows[1]["sessionId"]
    assert counts(s) == {k: raw[k] for k in ("turns", "tool_calls", "tool_results", "reasoning")}
    assert set(s.models) == raw["models"]
    assert_links(s)
    roundtrip(s)
    # the streamed lines of one message id are one assistant message, in block order
    mid = next(r["message"]["id"] for r in main if r["type"] == "assistant")
    merged = next(m for m in s.messages if m.meta.get("message_id") == mid)
    lines = [r for r in main if r["type"] == "assistant" and r["message"]["id"] == mid]
    assert len(lines) > 1
    assert [c.id for c in merged.tool_calls] == [b["id"] for r in lines for b in r["message"]["content"]
                                                 if b["type"] == "tool_use"]
    # the compaction: summary message after the boundary, later turns start there
    summary_row = next(r for r in rows if r.get("isCompactSummary"))
    [at] = [i for i, m in enumerate(s.messages) if "compaction" in m.meta]
    assert s.messages[at].content == summary_row["message"]["content"]
    assert s.messages[at].meta["compaction"]["tokens_before"] == next(
        r for r in rows if r.get("subtype") == "compact_boundary")["compactMetadata"]["preTokens"]
    after = next(i for i in range(at, len(s.messages)) if s.messages[i].role == "assistant")
    assert s.turn(after).messages[0].content == summary_row["message"]["content"]
    assert len(s.turn(after).messages) == after - at
    # the subagent (Task tool) is its own session, read from agent_progress entries
    sub_rows = [r["data"]["message"] for r in rows if r.get("type") == "progress"
                and r["data"].get("type") == "agent_progress"]
    assert len(sessions) == 2
    sub = sessions[1]
    assert sub.id.startswith(s.id + "/agent-")
    raw_sub = raw_claude(sub_rows)
    assert counts(sub) == {k: raw_sub[k] for k in ("turns", "tool_calls", "tool_results", "reasoning")}
    assert set(sub.models) == raw_sub["models"]
    assert_links(sub)


def test_mini_swe_agent_public_session() -> None:
    s, doc = public_session("mini-swe-agent", "marshmallow-code__marshmallow-1343.traj.json")
    assistants = [m for m in doc["messages"] if m["role"] == "assistant"]
    assert s.format == "mini-swe-agent"
    assert counts(s) == {"turns": len(assistants), "tool_calls": sum(len(m["tool_calls"]) for m in assistants),
                         "tool_results": sum(1 for m in doc["messages"] if m["role"] == "tool"),
                         "reasoning": sum(1 for m in assistants if (m.get("reasoning_content") or "").strip())}
    assert set(s.models) == {m["extra"]["response"]["model"] for m in assistants}
    assert len(s.messages) == sum(1 for m in doc["messages"] if m["role"] != "exit")
    assert s.meta["submission"] == next(m["content"] for m in doc["messages"] if m["role"] == "exit")
    # arguments are parsed from the JSON text the model wrote
    call = assistants[0]["tool_calls"][0]
    assert s.messages[2].tool_calls[0].args == json.loads(call["function"]["arguments"])
    assert s.messages[2].reasoning == assistants[0]["reasoning_content"]
    assert_links(s)
    roundtrip(s)


def test_openhands_public_session() -> None:
    s, events = public_session("openhands", "basic.json")
    responses: dict[str, dict[str, Any]] = {}
    text_turns = 0
    for e in events:
        meta = e.get("tool_call_metadata")
        if e.get("source") == "agent" and "action" in e:
            if meta:
                responses[meta["model_response"]["id"]] = meta["model_response"]
            elif e["action"] in ("message", "finish"):
                text_turns += 1
    messages = [r["choices"][0]["message"] for r in responses.values()]
    assert s.format == "openhands"
    assert counts(s) == {"turns": len(responses) + text_turns,
                         "tool_calls": sum(len(m.get("tool_calls") or []) for m in messages),
                         "tool_results": sum(1 for e in events if "observation" in e and e.get("tool_call_metadata")),
                         "reasoning": sum(1 for m in messages if (m.get("reasoning_content") or "").strip())}
    assert set(s.models) == {r["model"] for r in responses.values()}
    first_call = messages[0]["tool_calls"][0]
    got = next(m for m in s.messages if m.role == "assistant").tool_calls[0]
    assert (got.name, got.args) == (first_call["function"]["name"], json.loads(first_call["function"]["arguments"]))
    assert s.messages[0].role == "user" and s.messages[0].content == events[0]["args"]["content"]
    assert_links(s)
    roundtrip(s)


def test_swe_agent_public_session() -> None:
    s, doc = public_session("swe-agent", "swe-agent__test-repo-i1.traj")
    history = doc["history"]
    acting = [i for i, h in enumerate(history) if h["role"] == "assistant" and h.get("action", "").strip()]
    observed = [i for i in acting if i + 1 < len(history) and history[i + 1]["role"] == "user"]
    assert s.format == "swe-agent"
    assert counts(s) == {"turns": sum(1 for h in history if h["role"] == "assistant"), "tool_calls": len(acting),
                         "tool_results": len(observed), "reasoning": 0}
    assert len(s.messages) == len(history)
    # each step's action is the command of its call, its thought the visible text
    for i in acting:
        assert s.messages[i].tool_calls[0].args == {"command": history[i]["action"].strip("\n")}
        assert s.messages[i].content == history[i]["thought"]
        assert s.messages[i].meta["raw_output"] == history[i]["content"]
    assert [s.messages[i].tool_calls[0].args["command"] for i in acting] == \
        [t["action"].strip("\n") for t in doc["trajectory"]]
    for i in observed:
        assert s.messages[i + 1].content == history[i + 1]["content"]
    assert_links(s)
    roundtrip(s)


# ----------------------------------------------------------------- samples: pi tree

def _pi_entry(kind: str, eid: str, parent: str | None, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "id": eid, "parentId": parent, "timestamp": f"2025-12-03T14:00:{len(eid):02d}.000Z", **fields}


def _pi_assistant(content: list[dict[str, Any]], model: str = "claude-sonnet-4-5") -> dict[str, Any]:
    return {"role": "assistant", "content": content, "api": "anthropic-messages", "provider": "anthropic",
            "model": model, "usage": {"input": 10, "output": 5}, "stopReason": "toolUse", "timestamp": 1}


def write_pi_tree(path: Path) -> None:
    rows = [
        {"type": "session", "version": 3, "id": "7f6c1a2e-pi-tree", "timestamp": "2025-12-03T14:00:00.000Z",
         "cwd": "/work/project"},
        _pi_entry("message", "a1", None, message={"role": "user", "content": "list the files", "timestamp": 1}),
        _pi_entry("message", "a2", "a1", message=_pi_assistant([
            {"type": "thinking", "thinking": "I should run ls.", "thinkingSignature": "sig"},
            {"type": "toolCall", "id": "call_ls", "name": "bash", "arguments": {"command": "ls"}}])),
        _pi_entry("message", "a3", "a2", message={"role": "toolResult", "toolCallId": "call_ls", "toolName": "bash",
                                                  "content": [{"type": "text", "text": "README.md\nsrc"}],
                                                  "isError": False, "timestamp": 2}),
        # first branch, later abandoned by /tree
        _pi_entry("message", "b1", "a3", message=_pi_assistant([{"type": "text", "text": "Two entries."}])),
        _pi_entry("message", "b2", "b1", message={"role": "user", "content": "now delete src", "timestamp": 3}),
        # the branch the user went back to, from a3, with a summary of the abandoned one
        _pi_entry("branch_summary", "c1", "a3", fromId="b2", summary="The user asked to delete src."),
        _pi_entry("model_change", "c2", "c1", provider="anthropic", modelId="claude-opus-4-5"),
        _pi_entry("message", "c3", "c2", message={"role": "user", "content": [{"type": "text", "text": "read README"}],
                                                  "timestamp": 4}),
        _pi_entry("message", "c4", "c3", message=_pi_assistant([
            {"type": "text", "text": "Reading it."},
            {"type": "toolCall", "id": "call_read", "name": "read", "arguments": {"path": "README.md"}}],
            model="claude-opus-4-5")),
        _pi_entry("message", "c5", "c4", message={"role": "toolResult", "toolCallId": "call_read", "toolName": "read",
                                                  "content": [{"type": "text", "text": "# Project"}], "isError": False,
                                                  "timestamp": 5}),
        _pi_entry("compaction", "c6", "c5", summary="Listed files and read README.", firstKeptEntryId="c3",
                  tokensBefore=1234),
        _pi_entry("label", "c7", "c6", targetId="c3", label="checkpoint"),
        _pi_entry("message", "c8", "c7", message={"role": "user", "content": "thanks", "timestamp": 6}),
        _pi_entry("message", "c9", "c8", message=_pi_assistant([{"type": "text", "text": "You're welcome."}],
                                                               model="claude-opus-4-5")),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_pi_tree_follows_the_active_branch(tmp_path: Path) -> None:
    path = tmp_path / "2025-12-03T14-00-00-000Z_7f6c1a2e.jsonl"
    write_pi_tree(path)
    [s] = load_sessions(path)
    assert s.format == "pi" and s.id == "7f6c1a2e-pi-tree" and s.meta["pi_version"] == 3
    texts = [(m.role, m.content) for m in s.messages]
    assert ("assistant", "Two entries.") not in texts and ("user", "now delete src") not in texts
    assert any("2 entries off the active branch" in w for w in s.warnings)
    roles = [m.role for m in s.messages]
    assert roles == ["user", "assistant", "tool", "user", "user", "assistant", "tool", "user", "user", "assistant"]
    assert "The user asked to delete src." in s.messages[3].content and s.messages[3].meta["kind"] == "branch_summary"
    assert s.messages[1].reasoning == "I should run ls."
    assert s.messages[1].tool_calls[0].args == {"command": "ls"}
    assert s.messages[2].content == "README.md\nsrc" and s.messages[2].name == "bash"
    summary = s.messages[7]
    assert summary.meta["compaction"] == {"first_kept": 4, "tokens_before": 1234}
    assert summary.content.startswith("The conversation history before this point was compacted")
    assert counts(s) == {"turns": 3, "tool_calls": 2, "tool_results": 2, "reasoning": 1}
    assert s.models == ["claude-opus-4-5", "claude-sonnet-4-5"]
    # the last turn sees what pi sends: summary, kept messages from c3, then what followed
    turn = s.turn(9)
    assert [m.content for m in turn.messages] == [summary.content, "read README", "Reading it.", "# Project", "thanks"]
    assert_links(s)
    roundtrip(s)


# ----------------------------------------------------------------- samples: Codex rollout

def _rl(kind: str, payload: dict[str, Any], second: int) -> dict[str, Any]:
    return {"timestamp": f"2025-10-29T00:59:{second:02d}.000Z", "type": kind, "payload": payload}


def write_codex(path: Path) -> None:
    rows = [
        _rl("session_meta", {"id": "019a2d7a-41c4-78b1-b7cc-a45d62a89cd5", "timestamp": "2025-10-29T00:59:38.308Z",
                             "cwd": "/tmp/proj", "originator": "codex_cli_rs", "cli_version": "0.46.0",
                             "instructions": None, "source": "cli", "model_provider": "openai"}, 0),
        _rl("response_item", {"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}]}, 1),
        _rl("response_item", {"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": "fix the failing test"}]}, 1),
        _rl("event_msg", {"type": "user_message", "message": "fix the failing test", "kind": "plain"}, 1),
        _rl("turn_context", {"cwd": "/tmp/proj", "approval_policy": "on-request", "model": "gpt-5-codex",
                             "effort": "medium", "summary": "auto"}, 1),
        _rl("event_msg", {"type": "agent_reasoning", "text": "**Running the tests**"}, 2),
        _rl("response_item", {"type": "reasoning", "summary": [{"type": "summary_text", "text": "**Running the tests**"}],
                              "content": None, "encrypted_content": "gAAAAB..."}, 2),
        _rl("response_item", {"type": "function_call", "name": "shell",
                              "arguments": "{\"command\":[\"pytest\",\"-q\"],\"workdir\":\"/tmp/proj\"}",
                              "call_id": "call_A1"}, 2),
        _rl("event_msg", {"type": "token_count", "info": None}, 2),
        _rl("response_item", {"type": "function_call_output", "call_id": "call_A1",
                              "output": "{\"output\":\"1 failed\",\"metadata\":{\"exit_code\":1}}"}, 3),
        _rl("response_item", {"type": "reasoning", "summary": [],
                              "content": [{"type": "reasoning_text", "text": "The assertion uses the wrong sign."}],
                              "encrypted_content": None}, 4),
        _rl("response_item", {"type": "custom_tool_call", "status": "completed", "call_id": "call_B2",
                              "name": "apply_patch",
                              "input": "*** Begin Patch\n*** Update File: t.py\n-x = -1\n+x = 1\n*** End Patch"}, 4),
        _rl("event_msg", {"type": "token_count", "info": None}, 4),
        _rl("response_item", {"type": "custom_tool_call_output", "call_id": "call_B2", "output": "Success."}, 5),
        _rl("response_item", {"type": "reasoning", "summary": [], "content": None, "encrypted_content": "gAAAAC..."}, 6),
        _rl("response_item", {"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": "Fixed the sign in t.py."}]}, 6),
        _rl("event_msg", {"type": "agent_message", "message": "Fixed the sign in t.py."}, 6),
        _rl("event_msg", {"type": "token_count", "info": None}, 6),
        _rl("compacted", {"message": "Summary: fixed t.py."}, 7),
        _rl("turn_context", {"cwd": "/tmp/proj", "model": "gpt-5"}, 8),
        _rl("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]}, 8),
        _rl("response_item", {"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": "Anytime."}]}, 9),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_codex_rollout(tmp_path: Path) -> None:
    path = tmp_path / "rollout-2025-10-29T00-59-38-019a2d7a-41c4-78b1-b7cc-a45d62a89cd5.jsonl"
    write_codex(path)
    [s] = load_sessions(path)
    assert s.format == "codex" and s.id == "019a2d7a-41c4-78b1-b7cc-a45d62a89cd5"
    assert [m.role for m in s.messages] == ["user", "user", "assistant", "tool", "assistant", "tool", "assistant",
                                            "user", "user", "assistant"]
    first, second, third = (s.messages[i] for i in (2, 4, 6))
    assert first.reasoning == "**Running the tests**" and first.model == "gpt-5-codex"
    assert first.tool_calls[0].args == {"command": ["pytest", "-q"], "workdir": "/tmp/proj"}
    assert second.reasoning == "The assertion uses the wrong sign."
    assert second.tool_calls[0].name == "apply_patch" and second.tool_calls[0].arguments.startswith("*** Begin Patch")
    assert third.content == "Fixed the sign in t.py." and third.reasoning == "" and third.meta["encrypted_reasoning"] == 1
    assert s.messages[3].content.startswith("{\"output\":\"1 failed\"") and s.messages[3].name == "shell"
    assert s.messages[5].content == "Success." and s.messages[5].name == "apply_patch"
    assert s.messages[7].meta["compaction"]["first_kept"] is None
    assert s.messages[9].model == "gpt-5"
    assert counts(s) == {"turns": 4, "tool_calls": 2, "tool_results": 2, "reasoning": 2}
    assert [m.content for m in s.turn(9).messages] == ["Summary: fixed t.py.", "thanks"]
    assert_links(s)
    roundtrip(s)


def test_codex_early_bare_layout(tmp_path: Path) -> None:
    path = tmp_path / "rollout-2025-05-07T17-24-21-5973b6c0.jsonl"
    rows = [{"id": "5973b6c0-94b8-487b-a530-2aeb6098ae0e", "timestamp": "2025-05-07T17:24:21.123Z",
             "instructions": None},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
            {"record_type": "state"},
            {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"echo\",\"hi\"]}",
             "call_id": "call_1"},
            {"type": "function_call_output", "call_id": "call_1", "output": {"content": "hi\n", "success": True}},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    [s] = load_sessions(path)
    assert s.format == "codex" and s.id == rows[0]["id"]
    assert [m.role for m in s.messages] == ["user", "assistant", "tool", "assistant"]
    assert s.messages[2].content == "hi\n"
    assert_links(s)


# ----------------------------------------------------------------- samples: opencode export

def _part(kind: str, pid: str, **fields: Any) -> dict[str, Any]:
    return {"id": pid, "sessionID": "ses_1", "messageID": "msg", "type": kind, **fields}


def _tool(pid: str, call: str, tool: str, state: dict[str, Any]) -> dict[str, Any]:
    return _part("tool", pid, callID=call, tool=tool, state=state)


def write_opencode(path: Path) -> None:
    tokens = {"input": 100, "output": 20, "reasoning": 5, "cache": {"read": 0, "write": 0}}
    assistant = {"role": "assistant", "sessionID": "ses_1", "parentID": "msg_u1", "modelID": "claude-sonnet-4-5",
                 "providerID": "anthropic", "mode": "build", "agent": "build", "path": {"cwd": "/p", "root": "/p"},
                 "cost": 0.01, "tokens": tokens}
    doc = {
        "info": {"id": "ses_1", "slug": "calm-river", "projectID": "p1", "directory": "/p", "title": "Fix bug",
                 "version": "1.1.36", "time": {"created": 1736236800000, "updated": 1736236900000}},
        "messages": [
            {"info": {"id": "msg_u1", "sessionID": "ses_1", "role": "user", "time": {"created": 1736236800000},
                      "agent": "build", "model": {"providerID": "anthropic", "modelID": "claude-sonnet-4-5"}},
             "parts": [_part("text", "p1", text="fix the bug in a.py"),
                       _part("text", "p2", text="ignored draft", ignored=True)]},
            {"info": {**assistant, "id": "msg_a1", "time": {"created": 1736236801000, "completed": 1736236820000}},
             "parts": [_part("step-start", "p3"),
                       _part("reasoning", "p4", text="Read the file first.", time={"start": 1, "end": 2}),
                       _part("text", "p5", text="Let me look."),
                       _tool("p6", "toolu_1", "read", {"status": "completed", "input": {"filePath": "/p/a.py"},
                                                        "output": "1\tx = 1", "title": "a.py", "metadata": {},
                                                        "time": {"start": 3, "end": 4}}),
                       _part("step-finish", "p7", reason="tool-calls", cost=0.0, tokens=tokens),
                       _part("step-start", "p8"),
                       _tool("p9", "toolu_2", "edit", {"status": "error",
                                                        "input": {"filePath": "/p/a.py", "oldString": "x = 1",
                                                                  "newString": "x = 2"},
                                                        "error": "oldString not found", "time": {"start": 5, "end": 6}}),
                       _tool("p10", "toolu_3", "bash", {"status": "running", "input": {"command": "pytest"},
                                                         "time": {"start": 7}}),
                       _part("step-finish", "p11", reason="tool-calls", cost=0.0, tokens=tokens),
                       _part("step-start", "p12"),
                       _part("text", "p13", text="The edit failed; stopping."),
                       _part("step-finish", "p14", reason="stop", cost=0.0, tokens=tokens)]},
            {"info": {"id": "msg_u2", "sessionID": "ses_1", "role": "user", "time": {"created": 1736236830000},
                      "agent": "build", "model": {"providerID": "anthropic", "modelID": "claude-sonnet-4-5"}},
             "parts": [_part("compaction", "p15", auto=True)]},
            {"info": {**assistant, "id": "msg_a2", "summary": True, "modelID": "claude-haiku-4-5",
                      "time": {"created": 1736236831000}},
             "parts": [_part("step-start", "p16"), _part("text", "p17", text="We tried to fix a.py."),
                       _part("step-finish", "p18", reason="stop", cost=0.0, tokens=tokens)]},
        ],
        "todos": [],
    }
    path.write_text(json.dumps(doc, indent=2))


def test_opencode_export_steps_and_tool_parts(tmp_path: Path) -> None:
    path = tmp_path / "ses_1.json"
    write_opencode(path)
    [s] = load_sessions(path)
    assert s.format == "opencode" and s.id == "ses_1" and s.meta["title"] == "Fix bug"
    assert [m.role for m in s.messages] == ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant",
                                            "user", "assistant"]
    assert s.messages[0].content == "fix the bug in a.py"
    step1, step2, step3 = s.messages[1], s.messages[3], s.messages[6]
    assert (step1.reasoning, step1.content) == ("Read the file first.", "Let me look.")
    assert step1.tool_calls[0].args == {"filePath": "/p/a.py"} and s.messages[2].content == "1\tx = 1"
    assert [c.name for c in step2.tool_calls] == ["edit", "bash"]
    assert s.messages[4].content == "oldString not found" and s.messages[4].meta["is_error"]
    assert s.messages[5].content == "[Tool execution was interrupted]"
    assert step3.content == "The edit failed; stopping." and not step3.tool_calls
    assert s.messages[0].timestamp == "2025-01-07T08:00:00.000Z"
    assert s.messages[7].content == "What did we do so far?" and "compaction" in s.messages[7].meta
    assert s.messages[8].meta["summary"] and s.messages[8].model == "claude-haiku-4-5"
    assert counts(s) == {"turns": 4, "tool_calls": 3, "tool_results": 3, "reasoning": 1}
    assert s.models == ["claude-haiku-4-5", "claude-sonnet-4-5"]
    assert [m.content for m in s.turn(8).messages] == ["What did we do so far?"]
    assert_links(s)
    roundtrip(s)


# ----------------------------------------------------------------- samples: OpenAI messages

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": [{"type": "text", "text": "what is in /tmp?"}]},
    {"role": "assistant", "content": None, "reasoning_content": "List it.",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls /tmp\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    {"role": "assistant", "content": "<think>Answer briefly.</think>It holds a.txt."},
]


def test_openai_messages_shapes(tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "qwen3", "messages": CONVERSATION, "tools": TOOLS}))
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(CONVERSATION))
    lines = tmp_path / "log.jsonl"
    lines.write_text("".join(json.dumps(m) + "\n" for m in CONVERSATION))
    results = {}
    for path in (body, listed, lines):
        [s] = load_sessions(path)
        assert s.format == "openai-messages"
        assert counts(s) == {"turns": 2, "tool_calls": 1, "tool_results": 1, "reasoning": 2}
        assert s.messages[2].tool_calls[0].args == {"cmd": "ls /tmp"} and s.messages[3].name == "bash"
        assert (s.messages[4].reasoning, s.messages[4].content) == ("Answer briefly.", "It holds a.txt.")
        assert_links(s)
        roundtrip(s)
        results[path.name] = s
    assert results["body.json"].tools == TOOLS and results["body.json"].models == ["qwen3"]
    assert results["body.json"].turn(4).tools[0].name == "bash"
    assert results["list.json"].models == []


def test_openai_request_bodies_form_sessions(tmp_path: Path) -> None:
    bodies = [{"model": "m-1", "messages": CONVERSATION[:2], "tools": TOOLS},
              {"model": "m-2", "messages": CONVERSATION[:4], "tools": TOOLS},
              {"model": "m-3", "messages": CONVERSATION, "tools": TOOLS},
              {"model": "m-4", "messages": [{"role": "user", "content": "another task"}]}]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    first, second = load_sessions(path)
    assert [m.content for m in first.messages] == ["You are a coding agent.", "what is in /tmp?", "", "a.txt",
                                                   "It holds a.txt."]
    assert len(first.messages) == 5 and first.meta["requests"] == 3
    # each assistant message was written by the request before the body it first appears in
    assert [m.model for m in first.messages if m.role == "assistant"] == ["m-1", "m-2"]
    assert len(second.messages) == 1 and second.messages[0].content == "another task"
    assert first.tools == TOOLS
    as_list = tmp_path / "requests.json"
    as_list.write_text(json.dumps(bodies))
    assert [len(s.messages) for s in load_sessions(as_list)] == [5, 1]


# ----------------------------------------------------------------- detection and CLI

def test_detection_names_every_format(tmp_path: Path) -> None:
    assert set(ALL_FORMATS) <= set(known_formats())
    junk = tmp_path / "notes.jsonl"
    junk.write_text('{"hello": 1}\n{"world": 2}\n')
    with pytest.raises(UnknownFormat) as err:
        load_sessions(junk)
    assert all(name in str(err.value) for name in ALL_FORMATS)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), "traces", *args], capture_output=True, text=True, timeout=60)


def test_cli_unknown_format_exits_2(tmp_path: Path) -> None:
    junk = tmp_path / "notes.json"
    junk.write_text('{"title": "not a session"}')
    proc = run_cli("import", str(junk))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert f"{junk}: not a session format jumpahead knows" in err
    assert all(name in err for name in ALL_FORMATS)
    missing = run_cli("import", str(tmp_path / "absent.jsonl"))
    assert missing.returncode == 2 and "no such file" in missing.stderr and "openai-messages" in missing.stderr
    forced = run_cli("import", "--format", "codex", str(junk))
    assert forced.returncode == 2 and "not a codex session" in forced.stderr
    bad_name = run_cli("import", "--format", "nope", str(junk))
    assert bad_name.returncode == 2 and "unknown format 'nope'" in bad_name.stderr


def test_cli_import_summary_json_and_out(tmp_path: Path) -> None:
    pi, codex, opencode = tmp_path / "pi.jsonl", tmp_path / "rollout-x.jsonl", tmp_path / "export.json"
    write_pi_tree(pi)
    write_codex(codex)
    write_opencode(opencode)
    out = tmp_path / "normalized"
    proc = run_cli("import", "--json", "--out", str(out), str(pi), str(codex), str(opencode))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    expected = [s for p in (pi, codex, opencode) for s in load_sessions(p)]
    assert [r["format"] for r in data["sessions"]] == ["pi", "codex", "opencode"]
    for row, session in zip(data["sessions"], expected):
        assert (row["turns"], row["tool_calls"], row["tool_results"], row["reasoning_blocks"]) == (
            session.turns, session.tool_call_count, counts(session)["tool_results"], session.reasoning_count)
        assert row["warning_messages"] == session.warnings
    assert len(data["written"]) == 3
    for written, session in zip(data["written"], expected):
        assert Session.from_dict(json.loads(Path(written).read_text())) == session
    table = run_cli("import", str(pi), str(codex))
    assert table.returncode == 0
    header, rule, *rows = table.stdout.splitlines()
    assert header.split()[:6] == ["session", "format", "msgs", "turns", "calls", "results"]
    assert rows[0].split()[:6] == ["7f6c1a2e-pi-tree", "pi", "10", "3", "2", "2"]
    assert rows[2].startswith("warning: 7f6c1a2e-pi-tree: skipped 2 entries off the active branch")


def test_claude_code_sample_with_a_first_line_beyond_the_detection_head(tmp_path: Path) -> None:
    base = {"sessionId": "s-1", "cwd": "/p", "version": "2.1.39", "isSidechain": False, "userType": "external"}
    big = "x" * 70_000  # longer than the 64 KiB head detection reads
    rows = [
        {**base, "type": "user", "uuid": "u1", "parentUuid": None, "timestamp": "2026-02-11T20:00:00Z",
         "message": {"role": "user", "content": big}},
        {**base, "type": "assistant", "uuid": "a1", "parentUuid": "u1", "timestamp": "2026-02-11T20:00:01Z",
         "message": {"id": "msg_1", "role": "assistant", "model": "claude-opus-4-6",
                     "content": [{"type": "thinking", "thinking": "Check the file.", "signature": "s"}]}},
        {**base, "type": "assistant", "uuid": "a2", "parentUuid": "a1", "timestamp": "2026-02-11T20:00:02Z",
         "message": {"id": "msg_1", "role": "assistant", "model": "claude-opus-4-6",
                     "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                  "input": {"file_path": "/p/a.py"}}]}},
        {**base, "type": "user", "uuid": "u2", "parentUuid": "a2", "timestamp": "2026-02-11T20:00:03Z",
         "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                  "content": [{"type": "text", "text": "     1→x = 1"}]}]}},
        {**base, "type": "assistant", "uuid": "a3", "parentUuid": "u2", "timestamp": "2026-02-11T20:00:04Z",
         "message": {"id": "msg_1", "role": "assistant", "model": "claude-opus-4-6",
                     "content": [{"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "ls"}}]}},
        {**base, "type": "user", "uuid": "u3", "parentUuid": "a3", "timestamp": "2026-02-11T20:00:05Z",
         "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "a.py",
                                                  "is_error": False}]}},
        {**base, "isSidechain": True, "agentId": "ab12", "type": "user", "uuid": "s1", "parentUuid": None,
         "timestamp": "2026-02-11T20:00:06Z", "message": {"role": "user", "content": "subtask"}},
        {"type": "summary", "summary": "Read a.py", "leafUuid": "u3"},
    ]
    path = tmp_path / "s-1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main, sub = load_sessions(path)
    assert main.format == "claude-code" and main.id == "s-1" and sub.id == "s-1/agent-ab12"
    assert [m.role for m in main.messages] == ["user", "assistant", "tool", "tool"]
    merged = main.messages[1]
    assert merged.reasoning == "Check the file." and [c.id for c in merged.tool_calls] == ["toolu_1", "toolu_2"]
    assert main.messages[2].content == "     1→x = 1" and main.messages[2].name == "Read"
    assert main.meta["titles"] == ["Read a.py"] and [m.content for m in sub.messages] == ["subtask"]
    assert_links(main)
