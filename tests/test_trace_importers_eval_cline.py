"""OpenHands evaluation output (output.jsonl) and Cline task histories
(api_conversation_history.json): samples written here in each tool's documented shape
(and the public OpenHands session wrapped as evaluation output), read by the importers
and by the real CLI. Counts come from this test's own walk of the raw files: events and
response ids for OpenHands; for Cline, XML closing tags, result headers and tool_use /
tool_result blocks matched by regular expressions here, never by the importer's parser."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jumpahead.traces.formats import UnknownFormat, detect, load_sessions
from jumpahead.traces.session import Session

from .conftest import shared_path
from .test_trace_importers import assert_links, counts, roundtrip, run_cli

# ----------------------------------------------------------------- OpenHands evaluation output

TS = "2025-06-01T10:00:{:02d}.000000"


def _ev(eid: int, source: str, **fields: Any) -> dict[str, Any]:
    return {"id": eid, "timestamp": TS.format(eid), "source": source, "message": "", **fields}


def _response(rid: str, text: str, calls: list[tuple[str, str, dict[str, Any]]], reasoning: str | None = None,
              model: str = "claude-sonnet-4-20250514") -> dict[str, Any]:
    msg: dict[str, Any] = {"content": text, "role": "assistant", "tool_calls": [
        {"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (cid, name, args) in enumerate(calls)]}
    if reasoning:
        msg["reasoning_content"] = reasoning
    return {"id": rid, "created": 1748772000, "model": model, "object": "chat.completion",
            "choices": [{"finish_reason": "tool_calls", "index": 0, "message": msg}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 40}}


def _meta(name: str, cid: str, response: dict[str, Any], total: int = 1) -> dict[str, Any]:
    return {"function_name": name, "tool_call_id": cid, "model_response": response, "total_calls_in_response": total}


def function_calling_history() -> list[dict[str, Any]]:
    """A CodeActAgent run with function calling (OpenHands 0.3x event dicts)."""
    r1 = _response("chatcmpl-1", "Let me look around.", [
        ("toolu_01", "execute_bash", {"command": "ls /workspace/repo"}),
        ("toolu_02", "str_replace_editor", {"command": "view", "path": "/workspace/repo/calc.py"})])
    r2 = _response("chatcmpl-2", "", [("toolu_03", "str_replace_editor", {
        "command": "str_replace", "path": "/workspace/repo/calc.py", "old_str": "a - b", "new_str": "a + b"})],
        reasoning="add() subtracts; the operator is wrong.")
    r3 = _response("chatcmpl-3", "Fixed.", [("toolu_04", "finish", {"message": "add() now adds."})])
    return [
        _ev(0, "agent", action="system", args={"content": "You are OpenHands agent, a helpful AI assistant.",
                                               "tools": [{"type": "function", "function": {"name": "execute_bash"}}],
                                               "openhands_version": "0.39.0", "agent_class": "CodeActAgent"}),
        _ev(1, "user", action="message", args={"content": "<uploaded_files>/workspace/repo</uploaded_files>\n"
                                                          "add() returns the wrong value.", "image_urls": None,
                                               "wait_for_response": False}),
        _ev(2, "user", action="recall", args={"recall_type": "workspace_context", "query": "add()"}),
        _ev(3, "environment", observation="recall", content="Added workspace context", cause=2, extras={}),
        _ev(4, "agent", action="run", args={"command": "ls /workspace/repo", "thought": "Let me look around.",
                                            "blocking": False, "is_input": False},
            tool_call_metadata=_meta("execute_bash", "toolu_01", r1, 2)),
        _ev(5, "agent", action="read", args={"path": "/workspace/repo/calc.py", "thought": ""},
            tool_call_metadata=_meta("str_replace_editor", "toolu_02", r1, 2)),
        _ev(6, "agent", observation="run", content="calc.py\ntest_calc.py", cause=4,
            extras={"command": "ls /workspace/repo", "metadata": {"exit_code": 0}},
            tool_call_metadata=_meta("execute_bash", "toolu_01", r1, 2)),
        _ev(7, "agent", observation="read", content="def add(a, b):\n    return a - b\n", cause=5,
            extras={"path": "/workspace/repo/calc.py"}, tool_call_metadata=_meta("str_replace_editor", "toolu_02", r1, 2)),
        _ev(8, "environment", observation="agent_state_changed", content="", extras={"agent_state": "running"}),
        _ev(9, "agent", action="edit", args={"path": "/workspace/repo/calc.py", "command": "str_replace",
                                             "old_str": "a - b", "new_str": "a + b", "thought": ""},
            tool_call_metadata=_meta("str_replace_editor", "toolu_03", r2)),
        _ev(10, "agent", observation="edit", content="The file /workspace/repo/calc.py has been edited.", cause=9,
            extras={"path": "/workspace/repo/calc.py"}, tool_call_metadata=_meta("str_replace_editor", "toolu_03", r2)),
        _ev(11, "agent", action="finish", args={"final_thought": "add() now adds.", "outputs": {}, "thought": "Fixed."},
            tool_call_metadata=_meta("finish", "toolu_04", r3)),
    ]


def text_era_pairs() -> list[list[dict[str, Any]]]:
    """A 2024 output: [action, observation] pairs, CodeAct text actions, no tool_call_metadata."""
    null = {"message": "No observation", "observation": "null", "content": "", "extras": {}}
    return [
        [_ev(1, "user", action="message", args={"content": "Fix the failing test.", "images_urls": None,
                                                 "wait_for_response": False}), null],
        [_ev(2, "agent", action="run", args={"command": "pytest -q", "thought": "Run the tests first.",
                                             "blocking": False, "keep_prompt": True, "is_confirmed": "confirmed"}),
         _ev(3, "agent", observation="run", content="1 failed", cause=2, extras={"command": "pytest -q", "exit_code": 1})],
        [_ev(4, "agent", action="run_ipython", args={"code": "import calc; calc.add(1, 2)", "thought": "Check add()."}),
         _ev(5, "agent", observation="run_ipython", content="-1", cause=4, extras={"code": "import calc"})],
        [_ev(6, "agent", action="finish", args={"outputs": {}, "thought": "The sign is wrong; fixed."}), null],
    ]


def eval_output(instance_id: str, history: list[Any] | None, *, error: str | None = None,
                instruction: str = "Fix the issue.") -> dict[str, Any]:
    return {"instance_id": instance_id, "test_result": {"git_patch": "diff --git a/calc.py b/calc.py\n"},
            "instruction": instruction,
            "metadata": {"agent_class": "CodeActAgent", "llm_config": {"model": "litellm_proxy/claude-sonnet-4",
                                                                      "temperature": 0.0},
                         "max_iterations": 100, "eval_output_dir": "evaluation/evaluation_outputs/outputs",
                         "start_time": "2025-06-01 10:00:00", "git_commit": "0" * 40,
                         "dataset": "princeton-nlp__SWE-bench_Verified-test", "data_split": None, "details": {}},
            "history": history, "metrics": {"accumulated_cost": 0.12, "costs": []},
            "error": error, "instance": {"repo": "acme/calc", "instance_id": instance_id}}


def write_eval_output(path: Path) -> list[dict[str, Any]]:
    rows = [eval_output("acme__calc-1", function_calling_history()),
            eval_output("acme__calc-2", text_era_pairs()),
            eval_output("acme__calc-3", [], error="RuntimeError: Agent reached maximum iteration",
                        instruction="Make subtract() handle None.")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


_RUNS = {"run", "run_ipython", "read", "write", "edit", "browse", "browse_interactive", "call_tool_mcp", "delegate"}


def raw_openhands(history: list[Any]) -> dict[str, int]:
    """Counts from the raw events: one turn per model response (or per text-era action /
    agent message), its tool calls, and the observations that answer them."""
    events = [e for item in history for e in (item if isinstance(item, list) else [item]) if e]
    responses: dict[str, dict[str, Any]] = {}
    turns = calls = 0
    text_era: set[int] = set()
    for e in events:
        if e.get("source") != "agent" or "action" not in e:
            continue
        if e.get("tool_call_metadata"):
            responses[e["tool_call_metadata"]["model_response"]["id"]] = e["tool_call_metadata"]["model_response"]
        elif e["action"] in _RUNS:
            turns, calls = turns + 1, calls + 1
            text_era.add(e["id"])
        elif e["action"] in ("message", "finish"):
            turns += 1
    messages = [r["choices"][0]["message"] for r in responses.values()]
    results = sum(1 for e in events if "observation" in e and (e.get("tool_call_metadata") or e.get("cause") in text_era))
    return {"turns": turns + len(responses), "tool_calls": calls + sum(len(m["tool_calls"]) for m in messages),
            "tool_results": results,
            "reasoning": sum(1 for m in messages if (m.get("reasoning_content") or "").strip())}


def test_openhands_eval_output_every_instance_a_session(tmp_path: Path) -> None:
    path = tmp_path / "output.jsonl"
    rows = write_eval_output(path)
    assert detect(path).name == "openhands-eval"
    sessions = load_sessions(path)
    assert [s.id for s in sessions] == [r["instance_id"] for r in rows]
    for s, row in zip(sessions, rows):
        assert s.format == "openhands-eval" and s.meta["instance_id"] == row["instance_id"]
        assert counts(s) == raw_openhands(row["history"])
        assert s.meta["model"] == "litellm_proxy/claude-sonnet-4" and s.meta["test_result"] == row["test_result"]
        assert_links(s)
        roundtrip(s)
    fc, text, failed = sessions
    # function calling: one assistant message per model response, its calls in order
    assert [m.role for m in fc.messages] == ["system", "user", "assistant", "tool", "tool", "assistant", "tool",
                                             "assistant"]
    assert [c.id for c in fc.messages[2].tool_calls] == ["toolu_01", "toolu_02"]
    assert fc.messages[2].tool_calls[1].args == {"command": "view", "path": "/workspace/repo/calc.py"}
    assert fc.messages[5].reasoning == "add() subtracts; the operator is wrong."
    assert fc.messages[4].content == rows[0]["history"][7]["content"] and fc.messages[4].name == "str_replace_editor"
    assert fc.models == ["claude-sonnet-4-20250514"] and fc.tools == rows[0]["history"][0]["args"]["tools"]
    # text era: each action is a call rebuilt from its args, answered by the observation it caused
    pairs = rows[1]["history"]
    assert [m.role for m in text.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert text.messages[1].tool_calls[0].name == "run" and text.messages[1].content == "Run the tests first."
    assert text.messages[1].tool_calls[0].args == {"command": "pytest -q", "keep_prompt": True}
    assert text.messages[2].content == pairs[1][1]["content"] and text.messages[4].name == "run_ipython"
    assert text.models == ["litellm_proxy/claude-sonnet-4"]  # no response recorded: the configured model
    # an instance that failed before the agent ran still holds its task, and says why it stopped
    assert [(m.role, m.content) for m in failed.messages] == [("user", "Make subtract() handle None.")]
    assert failed.warnings == ["the instance ended with an error: RuntimeError: Agent reached maximum iteration"]


def test_openhands_eval_output_of_the_public_trajectory(tmp_path: Path) -> None:
    """The public OpenHands session as its evaluation harness writes it: once as events,
    once as the older [action, observation] pairs; both read like the trajectory itself."""
    events = json.loads(shared_path("traces", "public", "openhands", "basic.json").read_text())
    by_cause = {e["cause"]: e for e in events if "observation" in e and "cause" in e}
    pairs = [[e, by_cause.get(e["id"], {})] for e in events if "action" in e]
    path = tmp_path / "output.jsonl"
    path.write_text(json.dumps(eval_output("basic-1", events)) + "\n" + json.dumps(eval_output("basic-2", pairs)) + "\n")
    as_events, as_pairs = load_sessions(path)
    [trajectory] = load_sessions(shared_path("traces", "public", "openhands", "basic.json"))
    for s in (as_events, as_pairs):
        assert counts(s) == raw_openhands(events) == counts(trajectory)
        assert [(m.role, m.content, m.tool_calls) for m in s.messages] == \
            [(m.role, m.content, m.tool_calls) for m in trajectory.messages]
        assert_links(s)


def test_openhands_eval_detection_is_by_content(tmp_path: Path) -> None:
    rows = [eval_output("acme__calc-1", function_calling_history())]
    named = tmp_path / "run-2025-06-01.jsonl"  # not output.jsonl
    named.write_text(json.dumps(rows[0]) + "\n")
    [s] = load_sessions(named)
    assert s.format == "openhands-eval" and s.id == "acme__calc-1"
    # SWE-bench predictions have instance ids but no history: not a session file
    preds = tmp_path / "output.jsonl"
    preds.write_text("".join(json.dumps({"instance_id": f"acme__calc-{i}", "model_patch": "diff",
                                         "model_name_or_path": "OpenHands"}) + "\n" for i in range(3)))
    with pytest.raises(UnknownFormat):
        load_sessions(preds)


# ----------------------------------------------------------------- Cline

ENV = ("<environment_details>\n# VSCode Visible Files\ncli.py\n\n# Current Time\n1/7/2025, 9:00:00 AM (UTC)\n\n"
       "# Current Mode\nACT MODE\n</environment_details>")


def _t(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def write_cline_xml(path: Path) -> list[dict[str, Any]]:
    """An XML-era task (Cline 3.x): tool calls as tags in the text, each result a header
    block followed by the output's blocks."""
    history = [
        {"role": "user", "content": [_t("<task>\nAdd a --verbose flag to cli.py\n</task>"), _t(ENV)]},
        {"role": "assistant", "content": [_t("<thinking>\nI need to see cli.py first.\n</thinking>\n\n"
                                             "<read_file>\n<path>cli.py</path>\n</read_file>")]},
        {"role": "user", "content": [_t("[read_file for 'cli.py'] Result:"),
                                     _t("import argparse\n\ndef main():\n    p = argparse.ArgumentParser()\n"
                                        "    p.parse_args()\n"), _t(ENV)]},
        {"role": "assistant", "content": [_t(
            "I'll add the flag, then run it.\n\n<replace_in_file>\n<path>cli.py</path>\n<diff>\n<<<<<<< SEARCH\n"
            "    p.parse_args()\n=======\n    p.add_argument(\"--verbose\", action=\"store_true\")\n"
            "    p.parse_args()\n>>>>>>> REPLACE\n</diff>\n</replace_in_file>\n\n<execute_command>\n"
            "<command>python cli.py --verbose</command>\n<requires_approval>false</requires_approval>\n"
            "</execute_command>")]},
        {"role": "user", "content": [
            _t("[replace_in_file for 'cli.py'] Result:"),
            _t("The content was successfully saved to cli.py.\n\n<final_file_content path=\"cli.py\">\n...\n"
               "</final_file_content>"),
            _t("Tool [execute_command] was not executed because a tool has already been used in this message. "
               "Only one tool may be used per message. You must assess the first tool's result before proceeding "
               "to use the next tool."), _t(ENV)]},
        {"role": "assistant", "content": [_t(
            "<write_to_file>\n<path>docs/usage.html</path>\n<content>\n<html><body><p>Pass <code>--verbose</code>; "
            "this page shows a literal </content> tag.</p></body></html>\n</content>\n</write_to_file>")]},
        {"role": "user", "content": [_t("[write_to_file for 'docs/usage.html'] Result:"),
                                     _t("The user denied this operation."),
                                     _t("The user provided the following feedback:\n<feedback>\nPut it in README.md "
                                        "instead\n</feedback>"), _t(ENV)]},
        {"role": "assistant", "content": [_t("<ask_followup_question>\n<question>Should --verbose also enable debug "
                                             "logging?</question>\n</ask_followup_question>")]},
        {"role": "user", "content": [_t("[ask_followup_question for 'Should --verbose also enable debug logging?'] "
                                        "Result:"), _t("<answer>\nNo\n</answer>"), _t(ENV)]},
        {"role": "assistant", "content": [_t("Done.\n\n<attempt_completion>\n<result>\nAdded --verbose to cli.py.\n"
                                             "</result>\n<command>python cli.py --help</command>\n"
                                             "</attempt_completion>")]},
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history))
    return history


PARSE_PY = ('def parse(s):\n    """Parse a number given as text, as the config loader reads it."""\n'
            "    value = s.strip()\n    return int(value)\n")


def write_cline_native(path: Path) -> list[dict[str, Any]]:
    """A native-tool-calling task (Cline 3.3x): tool_use / tool_result blocks, thinking,
    modelInfo; one message as some versions wrote it, a native call with a text result."""
    info = {"modelId": "claude-sonnet-4-5-20250929", "providerId": "anthropic", "mode": "act"}

    def assistant(blocks: list[dict[str, Any]], ts: int) -> dict[str, Any]:
        return {"role": "assistant", "content": blocks, "modelInfo": info,
                "metrics": {"tokens": {"prompt": 10, "completion": 80, "cached": 9000}}, "ts": ts}

    def use(cid: str, name: str, **args: Any) -> dict[str, Any]:
        return {"type": "tool_use", "id": cid, "name": name, "input": args, "call_id": cid}

    def result(cid: str, content: Any) -> dict[str, Any]:
        return {"type": "tool_result", "tool_use_id": cid, "call_id": cid, "content": content}

    history = [
        {"role": "user", "content": [_t("<task>\nWhy does test_parse fail?\n</task>"), _t(ENV)], "ts": 1760000000000},
        assistant([{"type": "thinking", "thinking": "Run the test first.", "signature": "c2ln", "summary": []},
                   _t("Let me run the test."),
                   use("toolu_01A", "execute_command", command="pytest -q tests/test_parse.py", requires_approval=False)],
                  1760000001000),
        {"role": "user", "content": [result("toolu_01A", "[execute_command for 'pytest -q tests/test_parse.py'] Result:\n"
                                                         "Command executed.\nOutput:\nE ValueError: '1.5'\n1 failed"),
                                     _t(ENV)], "ts": 1760000002000},
        assistant([{"type": "thinking", "thinking": "parse() calls int().", "signature": "c2ln", "summary": []},
                   use("toolu_02B", "read_file", path="parse.py"),
                   use("toolu_03C", "search_files", path=".", regex="parse\\(")], 1760000003000),
        {"role": "user", "content": [result("toolu_03C", [_t("[search_files for 'parse\\(' in '.'] Result:\n"
                                                             "tests/test_parse.py\n│assert parse('1.5') == 1.5")]),
                                     result("toolu_02B", "[read_file for 'parse.py'] Result:\n" + PARSE_PY), _t(ENV)],
         "ts": 1760000004000},
        assistant([use("toolu_04D", "replace_in_file", path="parse.py",
                       diff="<<<<<<< SEARCH\n" + PARSE_PY.split("\n", 1)[1] + "=======\n"
                            + PARSE_PY.split("\n", 1)[1].replace("int(value)", "float(value)") + ">>>>>>> REPLACE")],
                  1760000005000),
        {"role": "user", "content": [_t("[replace_in_file for 'parse.py'] Result:\nThe content was successfully saved "
                                        "to parse.py."),
                                     _t("\n# TODO LIST UPDATE REQUIRED - You MUST include the task_progress parameter "
                                        "in your NEXT tool call."), _t(ENV)], "ts": 1760000006000},
        assistant([_t("parse() used int() on a float string; it uses float() now."),
                   use("toolu_05E", "attempt_completion", result="parse() now accepts '1.5'.")], 1760000007000),
        {"role": "user", "content": [result("toolu_05E", "[attempt_completion] Result:\nThe user has provided feedback "
                                                         "on the results.\n<feedback>\nthanks\n</feedback>"), _t(ENV)],
         "ts": 1760000008000},
        assistant([_t("You're welcome.")], 1760000009000),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history))
    return history


# the test's own view of Cline's text conventions
_CLOSE = re.compile(r"</(read_file|replace_in_file|execute_command|write_to_file|ask_followup_question|"
                    r"attempt_completion)>\s*(?=\n\n|$)")
_HEADER = re.compile(r"^(\[[a-z_]+( for '.*')?\] Result:|Tool \[[a-z_]+\] was not executed)", re.S)


def _blocks(m: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [b for b in m["content"] if b["type"] == kind]


def raw_cline(history: list[dict[str, Any]]) -> dict[str, int]:
    assistants = [m for m in history if m["role"] == "assistant"]
    users = [m for m in history if m["role"] == "user"]
    # a call is an XML closing tag that ends a paragraph, or a tool_use block
    calls = sum(len(_CLOSE.findall(b["text"])) for m in assistants if not _blocks(m, "tool_use")
                for b in _blocks(m, "text")) + sum(len(_blocks(m, "tool_use")) for m in assistants)
    results = sum(len(_blocks(m, "tool_result")) + sum(1 for b in _blocks(m, "text") if _HEADER.match(b["text"]))
                  for m in users)
    return {"turns": len(assistants), "tool_calls": calls, "tool_results": results,
            "reasoning": sum(1 for m in assistants if _blocks(m, "thinking"))}


def cline_task(tmp_path: Path, task: str,
               write: Callable[[Path], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], Session]:
    """A task folder's api_conversation_history.json written by `write`: its history and the one
    session imported from it, checked to be a cline session named by the task, with the history's counts."""
    path = tmp_path / "tasks" / task / "api_conversation_history.json"
    history = write(path)
    [s] = load_sessions(path)
    assert s.format == "cline" and s.id == task
    assert counts(s) == raw_cline(history)
    return history, s


def test_cline_xml_tool_tags(tmp_path: Path) -> None:
    history, s = cline_task(tmp_path, "1736236800000", write_cline_xml)
    names = [c.name for m in s.messages for c in m.tool_calls]
    assert names == [m.group(1) for m in _CLOSE.finditer("\n\n".join(
        b["text"] for m in history if m["role"] == "assistant" for b in m["content"]))]
    read = s.messages[1]
    assert read.content == "<thinking>\nI need to see cli.py first.\n</thinking>"
    assert read.tool_calls[0].args == {"path": "cli.py"}
    # an older result: the header block, then the output's blocks
    assert s.messages[2].role == "tool"
    assert s.messages[2].content == "\n\n".join(b["text"] for b in history[2]["content"][:2])
    edit = next(m for m in s.messages if m.role == "assistant" and len(m.tool_calls) == 2)
    assert edit.content == "I'll add the flag, then run it."
    diff = edit.tool_calls[0].args["diff"]
    assert diff.startswith("<<<<<<< SEARCH") and diff.endswith(">>>>>>> REPLACE")
    assert edit.tool_calls[1].args == {"command": "python cli.py --verbose", "requires_approval": "false"}
    skipped = next(m for m in s.messages if m.role == "tool" and m.name == "execute_command")
    assert skipped.meta["not_run"] and "was not executed" in skipped.content
    # a file holding "</content>" keeps it: write_to_file's content runs to its last closing tag
    page = next(c for m in s.messages for c in m.tool_calls if c.name == "write_to_file").args["content"]
    assert page.startswith("<html>") and "a literal </content> tag" in page and page.endswith("</html>")
    denied = next(m for m in s.messages if m.role == "tool" and m.name == "write_to_file")
    assert "The user denied this operation." in denied.content and "Put it in README.md" in denied.content
    # the environment details stay with the user's message, after the results
    assert [m.role for m in s.messages[2:4]] == ["tool", "user"] and s.messages[3].content == ENV
    assert s.meta["unanswered_calls"] == 1  # attempt_completion ends the task
    assert_links(s)
    roundtrip(s)


def test_cline_native_tool_blocks(tmp_path: Path) -> None:
    history, s = cline_task(tmp_path, "1760000000000", write_cline_native)
    uses = [b for m in history if m["role"] == "assistant" for b in _blocks(m, "tool_use")]
    assert [(c.id, c.name, c.args) for m in s.messages for c in m.tool_calls] == \
        [(b["id"], b["name"], b["input"]) for b in uses]
    # results answer their call by id, also out of order
    answered = {m.tool_call_id: m for m in s.messages if m.role == "tool"}
    assert answered["toolu_03C"].name == "search_files" and answered["toolu_02B"].content == history[4]["content"][1]["content"]
    # a native call answered by a text result (as some versions wrote them)
    assert answered["toolu_04D"].content == history[6]["content"][0]["text"]
    after = s.messages[s.messages.index(answered["toolu_04D"]) + 1]
    assert after.role == "user" and "TODO LIST UPDATE REQUIRED" in after.content
    assert s.models == ["claude-sonnet-4-5-20250929"] and s.meta["modes"] == ["act"]
    assert s.messages[1].reasoning == "Run the test first." and s.messages[1].content == "Let me run the test."
    assert s.messages[1].timestamp == "2025-10-09T08:53:21.000Z"
    assert_links(s)
    roundtrip(s)


def test_cline_detection_is_by_content(tmp_path: Path) -> None:
    exported = tmp_path / "exported-task.json"  # any name: Cline's marks in the content decide
    history = write_cline_xml(exported)
    [s] = load_sessions(exported)
    assert s.format == "cline" and s.id == "exported-task" and counts(s) == raw_cline(history)
    plain = tmp_path / "api_conversation_history.json"  # an Anthropic message list without Cline's marks
    plain.write_text(json.dumps([{"role": "user", "content": [_t("hello")]},
                                 {"role": "assistant", "content": [_t("<read_file><path>a</path></read_file>")]}]))
    assert detect(plain).name == "openai-messages"


# ----------------------------------------------------------------- the real CLI

def test_cli_import_and_analyze_eval_output_and_cline(tmp_path: Path) -> None:
    output, xml, native = (tmp_path / "output.jsonl", tmp_path / "t1" / "api_conversation_history.json",
                           tmp_path / "t2" / "api_conversation_history.json")
    rows = write_eval_output(output)
    raws = [raw_openhands(r["history"]) for r in rows] + [raw_cline(write_cline_xml(xml)),
                                                          raw_cline(write_cline_native(native))]
    ids = [r["instance_id"] for r in rows] + ["t1", "t2"]
    proc = run_cli("import", "--json", "--out", str(tmp_path / "normalized"), str(output), str(xml), str(native))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [r["id"] for r in data["sessions"]] == ids
    assert [r["format"] for r in data["sessions"]] == ["openhands-eval"] * 3 + ["cline"] * 2
    for row, raw in zip(data["sessions"], raws):
        assert (row["turns"], row["tool_calls"], row["tool_results"], row["reasoning_blocks"]) == (
            raw["turns"], raw["tool_calls"], raw["tool_results"], raw["reasoning"])
    written = [Session.from_dict(json.loads(Path(w).read_text())) for w in data["written"]]
    assert [s.id for s in written] == ids
    table = run_cli("import", str(output))
    assert table.returncode == 0 and "warning: acme__calc-3: the instance ended with an error" in table.stdout
    analyzed = run_cli("analyze", "--json", str(output), str(xml), str(native))
    assert analyzed.returncode == 0, analyzed.stderr
    result = json.loads(analyzed.stdout)
    assert [s["id"] for s in result["sessions"]] == ids
    for s, raw in zip(result["sessions"], raws):
        assert (s["assistant_messages"], s["tool_calls"]) == (raw["turns"], raw["tool_calls"])
    # the file written by the edit tool repeats what the read showed: copyable from the context
    native_calls = {c["tool"]: c for c in result["sessions"][-1]["calls"]}
    assert native_calls["replace_in_file"]["from_context"] > 0

