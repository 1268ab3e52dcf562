"""The hindsight oracle arm (live/oracle.py, live/arms.py, live/agent.py, live/command.py):
the ordinary arm's recorded output of the same seed, supplied at a jump point only where
its content existed before it; the ideal-call oracle is the labelled steering arm."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from jumpahead.core.turn import Message, Tool, Turn
from jumpahead.live.agent import AgentOptions, run_task
from jumpahead.live.arms import ALL_ARMS, HINDSIGHT, LIVE_HINDSIGHT, STEERING, parse_live_arm, parse_live_arms
from jumpahead.live.oracle import (
    HINDSIGHT_FIELD,
    LiveHindsightJump,
    LiveMistakenJump,
    LiveOracleJump,
    hindsight_output,
    recorded_turns,
)
from jumpahead.live.sandbox import workspace
from jumpahead.live.world import make_task
from jumpahead.policies.api import BoundaryEvent, RequestContext, SessionState

WRITE = Tool("write_file", "Write a text file (replaces it).", {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"]})
SYSTEM = ('<|im_start|>system\nYou are a coding agent.\n<tools>\n'
          + json.dumps({"type": "function", "function": {"name": WRITE.name, "parameters": WRITE.parameters}})
          + '\n</tools><|im_end|>\n')
HEAD = "I write notes.txt.\n"
CALL_SO_FAR = '\n{"name": "write_file"'
CONTENT = "alpha beta gamma delta\n"
RECORDED = (HEAD + "<tool_call>" + CALL_SO_FAR
            + ', "arguments": {"path": "notes.txt", "content": ' + json.dumps(CONTENT) + "}}\n</tool_call>")


def _context(*turns: str) -> str:
    return SYSTEM + "".join(turns) + "<|im_start|>assistant\n"


def _hindsight(recorded: str) -> LiveHindsightJump:
    """The policy configured for a request that carries `recorded` as the turn's recording."""
    turn = Turn(messages=[Message("user", "x")], tools=[WRITE], extra={"jumpahead": {HINDSIGHT_FIELD: recorded}})
    try:  # requests' jumpahead options parsed once (core/options.py), where the tree has it
        from jumpahead.core.options import RequestOptions

        turn.options = RequestOptions(oracle_output=recorded)
    except ImportError:
        pass
    p = LiveHindsightJump()
    p.on_request(RequestContext(turn=turn, session=SessionState("s"), tokenizer=None, context_length=8192))
    return p


def _event(context: str) -> BoundaryEvent:
    output = HEAD + "<tool_call>" + CALL_SO_FAR
    return BoundaryEvent("tool_name", output, [], "", HEAD.strip(), context, tool_name=None, call_text=CALL_SO_FAR)


def _supplied(context: str) -> str:
    iv = _hindsight(RECORDED).on_boundary(_event(context))
    return iv.text if iv is not None else ""


def test_content_said_in_the_prompt_is_supplied():
    context = _context(f"<|im_start|>user\nCreate notes.txt with this content:\n```\n{CONTENT}```<|im_end|>\n")
    assert HEAD + "<tool_call>" + CALL_SO_FAR + _supplied(context) == RECORDED


def test_content_from_an_earlier_tool_result_is_supplied():
    context = _context("<|im_start|>user\nCopy draft.txt to notes.txt.<|im_end|>\n",
                       '<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "draft.txt"}}'
                       "\n</tool_call><|im_end|>\n",
                       f"<|im_start|>user\n<tool_response>\n{CONTENT}</tool_response><|im_end|>\n")
    assert _supplied(context).endswith(json.dumps(CONTENT) + "}}\n</tool_call>")


def test_content_that_did_not_exist_before_the_jump_is_not_supplied():
    """The recording is the model's own future: its content is known in hindsight, but a
    string the conversation never held is left for the model to write."""
    context = _context("<|im_start|>user\nCreate notes.txt with four words of your choice.<|im_end|>\n")
    text = _supplied(context)
    assert text == ', "arguments": {"path": "notes.txt", "content": "'  # the path is in the output so far
    assert "alpha" not in text


def test_nothing_is_supplied_once_the_model_left_the_recording():
    context = _context(f"<|im_start|>user\nCreate notes.txt with this content:\n```\n{CONTENT}```<|im_end|>\n")
    p = _hindsight(RECORDED.replace("I write", "I create"))
    assert p.on_boundary(_event(context)) is None
    assert _hindsight("").on_boundary(_event(context)) is None  # no recording: nothing


# --- which turn's recording a request carries ------------------------------------------------


def _record_turn(content: str, calls: list[tuple[str, dict]], output: str) -> dict:
    return {"content": content, "output": output,
            "calls": [{"name": n, "arguments": json.dumps(a), "result": "ok"} for n, a in calls]}


def test_a_turn_gets_the_recording_only_while_the_run_is_on_it():
    write = ("write_file", {"path": "a.txt", "content": "x\n"})
    rec = recorded_turns({"turns": [_record_turn("I write a.txt.", [write], "raw 0"),
                                    _record_turn("Created a.txt.", [], "raw 1")]})
    assert hindsight_output(rec, []) == "raw 0"
    same = SimpleNamespace(content="I write a.txt.", calls=[{"name": "write_file", "arguments": json.dumps(write[1])}])
    assert hindsight_output(rec, [same]) == "raw 1"
    other_text = SimpleNamespace(content="I create a.txt.", calls=same.calls)
    other_call = SimpleNamespace(content=same.content, calls=[{"name": "write_file", "arguments": "{}"}])
    assert hindsight_output(rec, [other_text]) is None and hindsight_output(rec, [other_call]) is None
    assert hindsight_output(rec, [same, same]) is None  # past the recording's end
    assert hindsight_output(recorded_turns({"turns": [{"content": "", "calls": []}]}), []) is None  # no raw text


class _Client:
    """An OpenAI client stand-in that answers from a script and keeps each request's
    `jumpahead` object."""

    def __init__(self, answers: list[tuple[str, list[tuple[str, dict]]]]) -> None:
        self.answers, self.sent = list(answers), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **kw):
        self.sent.append(json.loads(json.dumps(kw["extra_body"]["jumpahead"])))
        content, calls = self.answers.pop(0)
        tool_calls = [SimpleNamespace(id=f"c{i}", function=SimpleNamespace(name=n, arguments=json.dumps(a)))
                      for i, (n, a) in enumerate(calls)]
        message = SimpleNamespace(content=content, tool_calls=tool_calls or None)
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")], usage=None)


def test_the_agent_sends_each_turn_its_recording_and_stops_after_a_divergence():
    task = make_task(1_000_000, "create_file")
    name, args = task.ideal[0]
    rec = recorded_turns({"turns": [_record_turn("I write it.", [(name, args)], "raw 0"),
                                    _record_turn(task.answer, [], "raw 1")]})
    for first, want in (("I write it.", ["raw 0", "raw 1"]), ("I make it.", ["raw 0", None])):
        client = _Client([(first, [(name, args)]), (task.answer, [])])
        with workspace() as ws:
            record = run_task(client, task, ws, HINDSIGHT, {"methods": ["none"]}, "s", False, AgentOptions(),
                              hindsight=rec)
        assert [s.get(HINDSIGHT_FIELD) for s in client.sent] == want
        assert record.success and record.hindsight_turns == sum(w is not None for w in want)
        assert all(s["methods"] == ["none"] for s in client.sent)
    client = _Client([(task.answer, [])])  # not a hindsight arm: no recording, no count
    with workspace() as ws:
        record = run_task(client, task, ws, "ordinary", {}, "s", False, AgentOptions())
    assert HINDSIGHT_FIELD not in client.sent[0] and record.hindsight_turns is None


# --- arms and the runner ----------------------------------------------------------------------


def test_hindsight_and_steering_arms():
    hind, steer = parse_live_arm(HINDSIGHT), parse_live_arm(STEERING)
    assert hind.hindsight and not hind.oracle and hind.policies == [LIVE_HINDSIGHT]
    assert steer.oracle and not steer.hindsight and steer.policies == ["jumpahead.live.oracle:LiveOracleJump"]
    assert parse_live_arm("oracle-jump").policies == steer.policies  # the steering arm's old name
    assert parse_live_arm(f"{HINDSIGHT}:min_chars=8").policies == [f"{LIVE_HINDSIGHT}:min_chars=8"]
    mistaken = parse_live_arm("mistaken-jump:rate=0.1,base=hindsight")
    assert mistaken.hindsight and mistaken.policies == ["jumpahead.live.oracle:LiveMistakenJump:rate=0.1,base=hindsight"]
    assert parse_live_arm("mistaken-jump:rate=0.1,base=steering").oracle
    from jumpahead.policies.registry import parse_spec

    assert type(parse_spec(mistaken.policies[0]).build().base) is LiveHindsightJump
    assert type(LiveMistakenJump(rate="0.1", base="steering").base) is LiveOracleJump
    assert HINDSIGHT in ALL_ARMS and STEERING in ALL_ARMS and "oracle-jump" not in ALL_ARMS
    assert not any("base=oracle" in a or "base=steering" in a for a in ALL_ARMS)


def test_hindsight_arms_run_after_the_ordinary_arm_of_each_seed():
    from jumpahead.live.command import jobs

    arms = parse_live_arms(f"echo,{HINDSIGHT},jump")
    order = [(seed, arm.name) for seed, arm in jobs([7, 8, 9], arms)]
    assert order == [(7, "ordinary"), (7, "echo"), (7, "jump"), (7, HINDSIGHT),
                     (8, "echo"), (8, "jump"), (8, "ordinary"), (8, HINDSIGHT),
                     (9, "jump"), (9, "ordinary"), (9, "echo"), (9, HINDSIGHT)]


def test_the_runner_waits_for_the_ordinary_record_and_keeps_raw_outputs(tmp_path: Path):
    from jumpahead.live.agent import TaskRecord, TurnRecord
    from jumpahead.live.command import LiveOptions, Run, _join_trace

    run = Run(LiveOptions(arms=parse_live_arms(HINDSIGHT), seeds=[5], out=tmp_path, quiet=True))
    assert run.ordinary_record(5, 0.05) is None

    def finish() -> None:
        time.sleep(0.1)
        with run._recorded:
            run.records.append({"arm": "ordinary", "seed": 5, "turns": []})
            run._recorded.notify_all()

    threading.Thread(target=finish).start()
    assert run.ordinary_record(5, 5.0) == {"arm": "ordinary", "seed": 5, "turns": []}
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"type": "session", "format": "jumpahead-trace", "version": 2}) + "\n"
                     + json.dumps({"type": "turn", "index": 0, "timings": {"decode_s": 0.5},
                                   "response": {"runs": [{"text": "I write"}, {"text": " it.\n<tool_call>"}]}})
                     + "\n")
    record = TaskRecord(arm="ordinary", seed=5, kind="create_file", steps=1, session="s",
                        turns=[TurnRecord(0.1, "stop", 1, 1, 0, {}, "I write it.")])
    _join_trace(record, trace, wait_s=0)
    assert record.turns[0].output == "I write it.\n<tool_call>" and record.turns[0].timings["decode_s"] == 0.5
    assert recorded_turns(record.to_json())[0]["output"] == "I write it.\n<tool_call>"


def test_a_hindsight_run_through_real_servers_sends_the_ordinary_outputs(tmp_path: Path, tiny_model_dir):
    """Two servers of the tiny random-weight llama (its answers are noise; the point is
    the plumbing): the ordinary arm's records keep each turn's raw output, and the
    hindsight arm's first request carries the ordinary arm's first output."""
    from jumpahead.live.command import LiveOptions, run_live
    from jumpahead.live.world import split_seeds
    from jumpahead.traces.trace_file import read_trace

    out = tmp_path / "run"
    run_live(LiveOptions(arms=parse_live_arms(HINDSIGHT), seeds=split_seeds("heldout", 1), out=out,
                         model=str(tiny_model_dir), quiet=True,
                         agent=AgentOptions(max_steps=2, max_tokens=6, timeout_s=60)))
    lines = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    ordinary = next(r for r in lines if r["arm"] == "ordinary")
    hind = next(r for r in lines if r["arm"] == HINDSIGHT)
    assert ordinary["job"] < hind["job"] and ordinary["turns"][0]["output"]
    assert hind["hindsight_turns"] >= 1
    _, turns, _ = read_trace(next((out / "traces").glob("hindsight*/*.jsonl")))
    sent = turns[0]["request"]["body"]["jumpahead"]
    assert sent[HINDSIGHT_FIELD] == ordinary["turns"][0]["output"]
