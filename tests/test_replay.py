"""Forced and live replay (traces/replay.py, app/replay_command.py): arms emit exactly
the recorded tokens, supply tokens where they can, keep their own prefix caches, and a
wrong asserted intervention diverges the turn.

Forced replay masks every logit but the recorded token (traces/forcing.py), so what a
turn emits and which proposals are accepted do not depend on the weights: those tests
run on conftest.py's tiny random-weight llama (the default model's tokenizer and chat
template), which decodes ~100x faster. The drafter arm needs the default model (its
shipped drafter is trained for it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.engine.methods.proposal import Proposal
from jumpahead.core.exchange import BaseHooks
from jumpahead.traces.arms import Arm, ArmError, ArmSpec, parse_arm, parse_arms, split_arms
from jumpahead.traces.replay import ReplayOptions, forced_output, plan_session, replay
from jumpahead.core.turn import Message, ToolCall
from jumpahead.traces.session import Session

from .serving import cli_process, free_port, interrupt, wait_health

REPO = Path(__file__).resolve().parents[1]

CALC = '''def sub(a, b):
    """Return a - b."""
    return a - b
'''
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"]}}},
]


def small_session(final_text: bool = False) -> Session:
    """Two tool-call turns; the second copies the file the first one read."""
    new = CALC.replace("a - b.", "a - b (may be negative).")
    msgs = [
        Message("system", "You are a coding agent. Use the tools."),
        Message("user", "Fix the docstring of sub in calc.py."),
        Message("assistant", "", reasoning="Read calc.py first.",
                tool_calls=[ToolCall("read_file", {"path": "calc.py"}, "c1")]),
        Message("tool", CALC, tool_call_id="c1", name="read_file"),
        Message("assistant", "", tool_calls=[ToolCall("write_file", {"path": "calc.py", "content": new}, "c2")]),
    ]
    if final_text:
        msgs += [Message("tool", "ok", tool_call_id="c2", name="write_file"),
                 Message("assistant", "Done.")]
    return Session(id="small", format="test", messages=msgs, tools=TOOLS, source="test")


class Recorder:
    """A progress reporter that remembers the order arms ran in."""

    def __init__(self, total: float, turns: int) -> None:
        self.begun: list[str] = []
        self.total, self.turns = total, turns

    def begin(self, what: str) -> None:
        self.begun.append(what)

    def advance(self, units: float, step_done: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def forced(tiny_model):
    """One replay of the small session under ordinary, strict and echo (the tiny model:
    the output is forced, so the weights only set the timings). cost_aware off: every
    proposal is verified whole, so echo's acceptance on the second turn does not hang on
    the width policy's online fit of this machine's (tiny-model, loaded) round times."""
    progress: list[Recorder] = []
    warnings: list[str] = []

    def make(total: float, turns: int) -> Recorder:
        progress.append(Recorder(total, turns))
        return progress[0]

    doc = replay([small_session()], ReplayOptions(parse_arms("strict,echo"), cost_aware=False), tiny_model,
                 progress=make, warn=warnings.append)
    return doc, progress[0], warnings


def test_arm_names():
    assert split_arms("ordinary, jump:min_chars=8,x=1,echo") == ["ordinary", "jump:min_chars=8,x=1", "echo"]
    assert parse_arm("strict+echo").methods == ["strict", "echo"]
    assert parse_arm("echo").methods == ["echo", "none"]  # strict fill stays off: echo's figures alone
    assert parse_arm("oracle-jump").policy_specs == ["oracle-jump"] and parse_arm("oracle-jump").methods == ["none"]
    assert [a.name for a in parse_arms("echo")] == ["ordinary", "echo"]  # the baseline always runs
    with pytest.raises(ArmError, match="unknown arm 'bogus'"):
        parse_arms("ordinary,bogus")
    with pytest.raises(ArmError, match="oracle-jump"):
        parse_arm("oracle-jump:min_chars=x")  # the policy refuses its options up front


def test_forced_arms_emit_the_record(forced, tiny_model):
    doc, _, warnings = forced
    _, tokenizer, _ = tiny_model
    assert doc["kind"] == "jumpahead.replay" and doc["version"] == 1
    assert doc["arms"] == ["ordinary", "strict", "echo"]
    session = doc["sessions"][0]
    assert session["turns_total"] == 2 and session["turns_replayed"] == 2 and session["window"] is None
    turns = session["turns"]
    assert [t["index"] for t in turns] == [2, 4]
    s = small_session()
    for t in turns:
        recorded = forced_output(tokenizer, s.messages[t["index"]], s.turn(t["index"]).tools, False)[1]
        assert t["output_tokens"] == len(recorded)
        for name, arm in t["arms"].items():
            assert arm["identical"] is True, (name, t["index"])
            assert arm["diverged"] is False
            assert sum(arm["tokens_by_kind"].values()) == len(recorded)
            assert arm["model_s"] == pytest.approx(arm["prefill_s"] + arm["decode_s"], abs=1e-5)
        ordinary = t["arms"]["ordinary"]
        assert ordinary["tokens_by_kind"] == {"sampled": len(recorded)}
        assert ordinary["rounds"] == len(recorded) - 1  # one decode round per token after the first
        assert ordinary["interventions"] == []
        # strict fill supplies the call's template scaffold on both tool-call turns
        strict = t["arms"]["strict"]
        assert strict["tokens_by_kind"].get("strict", 0) > 0
        assert strict["rounds"] < ordinary["rounds"]
        supplied = [i for i in strict["interventions"] if i["kind"] != "unaccepted"]
        assert supplied and all(i["kind"] == "strict" and i["tokens"] > 0 and i["D_s"] > 0 for i in supplied)
        # rounds where the proposer ran and supplied nothing are priced too: one item, D = 0, last
        idle = [i for i in strict["interventions"] if i["kind"] == "unaccepted"]
        assert len(idle) <= 1 and all(i["D_s"] == 0 and i["tokens"] == 0 and i["rounds"] > 0 and i["H_s"] > 0
                                      for i in idle)
        assert not idle or strict["interventions"][-1] is idle[0]
    # the second turn copies the file the first one read: echo is accepted there
    echo = turns[1]["arms"]["echo"]
    assert echo["verified"]["accepted"] >= 8 and echo["tokens_by_kind"]["echo"] == echo["verified"]["accepted"]
    assert sum(i["tokens"] for i in echo["interventions"]) == echo["verified"]["accepted"]
    assert warnings == [] and doc["warnings"] == []
    assert set(doc["summary"]["ratios"]) == {"ordinary", "strict", "echo"}
    assert doc["summary"]["ratios"]["ordinary"] == 1.0
    totals = session["totals"]["echo"]
    assert totals["identical_turns"] == 2 and totals["tokens_by_kind"]["echo"] >= 8
    assert session["saved_share"]["echo"] == pytest.approx(1 - totals["model_s"] / session["totals"]["ordinary"]["model_s"],
                                                           abs=1e-3)


def test_arms_interleave_with_their_own_caches(forced):
    doc, progress, _ = forced
    # every arm on a turn before the next turn; the order rotates by one each turn
    assert [b.split(" arm ")[1] for b in progress.begun] == ["ordinary", "strict", "echo", "strict", "echo", "ordinary"]
    assert [b.split(" turn ")[1].split()[0] for b in progress.begun] == ["2"] * 3 + ["4"] * 3
    first, second = doc["sessions"][0]["turns"]
    assert first["order"] == ["ordinary", "strict", "echo"] and second["order"] == ["strict", "echo", "ordinary"]
    for name in ("ordinary", "strict", "echo"):
        # arm 2's first turn did not hit arm 1's cache; each arm's second turn hits its own first
        assert first["arms"][name]["cached_tokens"] == 0, name
        assert second["arms"][name]["cached_tokens"] >= first["prompt_tokens"], name


class _Assert:
    """Asserts `tokens` once, after `at` output tokens (a jump, right or wrong)."""

    name = "jump"

    def __init__(self, at: int, tokens: list[int]) -> None:
        self.at, self.tokens, self.done = at, tokens, False

    def propose(self, view, max_len):
        if self.done or len(view.tokens) - view.prompt_len != self.at:
            return None
        self.done = True
        return Proposal(list(self.tokens[:max_len]), "jump")

    def feedback(self, proposal, accepted):
        pass


class JumpHooks(BaseHooks):
    """A tiny policy: jump 6 tokens of the recorded output (oracle_output) after 4
    emitted tokens, or 6 wrong ones."""

    def __init__(self, wrong: bool) -> None:
        self.wrong = wrong

    def row_proposers(self, exchange, prepared):
        oracle = prepared.turn.options.oracle_output
        record = self.tokenizer.encode(oracle, add_special_tokens=False)
        tokens = self.tokenizer.encode(" hello world, this is wrong", add_special_tokens=False)[:6] if self.wrong \
            else record[4:10]
        return [_Assert(4, tokens)]


def test_wrong_asserted_jump_diverges(tiny_model):
    _, tokenizer, _ = tiny_model
    right, wrong = JumpHooks(False), JumpHooks(True)
    right.tokenizer = wrong.tokenizer = tokenizer
    arms = [parse_arm("ordinary"), Arm("right-jump", ArmSpec(["none"]), hooks=[right]),
            Arm("wrong-jump", ArmSpec(["none"]), hooks=[wrong])]
    s = small_session()
    s.messages = s.messages[:3]
    warnings: list[str] = []
    doc = replay([s], ReplayOptions(arms), tiny_model, warn=warnings.append)
    turn = doc["sessions"][0]["turns"][0]
    ok, bad = turn["arms"]["right-jump"], turn["arms"]["wrong-jump"]
    assert ok["identical"] and not ok["diverged"] and ok["tokens_by_kind"]["jump"] == 6
    assert [(i["kind"], i["at"], i["tokens"]) for i in ok["interventions"] if i["kind"] != "unaccepted"] == \
        [("jump", 4, 6)]
    assert bad["diverged"] and not bad["identical"] and bad["diverged_at"] == 4
    iv = bad["interventions"][0]
    assert iv["kind"] == "jump" and iv["wrong"] and iv["wasted_tokens"] == 6 and iv["D_s"] == 0
    # the row ended right after the wrong tokens; the rest of the record is charged at
    # the ordinary decode rate, and replay reports no recovery cost (it cannot observe one)
    assert sum(bad["tokens_by_kind"].values()) == 4 + 6 + 1
    plain = turn["arms"]["ordinary"]["decode_s"] / turn["arms"]["ordinary"]["rounds"]
    assert bad["rest_s"] == pytest.approx((turn["output_tokens"] - 4) * plain, rel=1e-3)
    assert bad["model_s"] == pytest.approx(bad["measured_model_s"] + bad["rest_s"], abs=1e-5)
    assert "R_s" not in json.dumps(doc)
    assert any("R (recovery) is not observable in forced replay" in n for n in doc["notes"])
    assert warnings == []  # a diverged turn is a measured mistake, not a replay fault


def _long_session(turns: int) -> Session:
    msgs = [Message("system", "You are a coding agent."), Message("user", "List and read the files.")]
    for i in range(turns):
        msgs.append(Message("assistant", f"Step {i}.", tool_calls=[ToolCall("bash", {"command": f"cat f{i}.txt"}, f"c{i}")]))
        msgs.append(Message("tool", "\n".join(f"line {i}.{k}: some file text here" for k in range(12)),
                                   tool_call_id=f"c{i}", name="bash"))
    msgs.append(Message("assistant", "All read."))
    return Session(id="long", format="test", messages=msgs, source="test")


def test_tail_window_keeps_a_common_prefix(loaded_model):
    _, tokenizer, _ = loaded_model
    s = _long_session(30)
    options = ReplayOptions(parse_arms("ordinary"), turns=20, max_context=1200, max_output_tokens=None)
    planned, skipped, window = plan_session(s, tokenizer, 8192, options)
    assert len(planned) == 20 and skipped == []
    assert window is not None and 1 <= window.reanchors < 10  # moved in steps, not every turn
    system = tokenizer.encode("You are a coding agent.", add_special_tokens=False)
    kept_prefix = 0
    for a, b in zip(planned, planned[1:]):
        assert len(a.prompt) <= 1200 and len(b.prompt) <= 1200
        assert a.window is not None and a.window["dropped_messages"][0] == 1  # the system message stays
        if a.window["kept_from"] == b.window["kept_from"]:
            assert b.prompt[: len(a.prompt)] == a.prompt  # the next turn extends this one's prompt
            kept_prefix += 1
        else:
            assert b.window["kept_from"] > a.window["kept_from"]
            assert s.messages[b.window["kept_from"]].role != "tool"
    assert kept_prefix >= 10
    text = tokenizer.decode(planned[-1].prompt)
    assert "You are a coding agent." in text and "List and read the files." not in text and len(system) > 0


def _write_session(path: Path, final_text: bool = True) -> None:
    """The small session as an OpenAI chat request body (the openai-messages importer)."""
    s = small_session(final_text)
    messages = []
    for m in s.messages:
        d = {"role": m.role, "content": m.content}
        if m.reasoning:
            d["reasoning_content"] = m.reasoning
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args)}}
                               for c in m.tool_calls]
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        messages.append(d)
    path.write_text(json.dumps({"model": "x", "messages": messages, "tools": TOOLS}))


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "replay", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_cli_prints_json_with_ratios(tmp_path, tiny_model_dir):
    path = tmp_path / "session.json"
    _write_session(path)
    out = tmp_path / "replay.json"
    proc = _cli(str(path), "--arms", "echo", "--turns", "1", "--out", str(out), "--model", str(tiny_model_dir))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == doc
    assert doc["arms"] == ["ordinary", "echo"] and doc["sessions"][0]["format"] == "openai-messages"
    assert doc["sessions"][0]["turns_replayed"] == 1 and doc["sessions"][0]["turns"][0]["index"] == 6
    assert doc["summary"]["ratios"]["ordinary"] == 1.0 and doc["summary"]["ratios"]["echo"] > 0
    assert "turns done" in proc.stderr  # progress lines (stderr is not a terminal here)


def test_cli_errors(tmp_path):
    path = tmp_path / "session.json"
    _write_session(path)
    proc = _cli(str(path), "--arms", "ordinary,nope", timeout=60)
    assert proc.returncode == 2 and "unknown arm 'nope'" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli(str(tmp_path / "missing.json"), timeout=60)
    assert proc.returncode == 2 and "missing.json" in proc.stderr and "Traceback" not in proc.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("not a session\n")
    proc = _cli(str(bad), timeout=60)
    assert proc.returncode == 2 and "bad.txt" in proc.stderr and "Traceback" not in proc.stderr


def test_live_replay_serves_the_recorded_turns(tmp_path, tiny_model_dir):
    from openai import OpenAI

    path = tmp_path / "session.json"
    _write_session(path)
    port = free_port()
    proc = cli_process(["replay", "--live", str(path), "--port", str(port), "--no-ssd-cache", "--log-level", "warning",
                        "--model", str(tiny_model_dir)],
                       cwd=REPO, env={"JUMPAHEAD_HOME": str(tmp_path / "home")})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_health(proc, base, timeout=120, ok=True, poll=0.5)
        client = OpenAI(base_url=f"{base}/v1", api_key="dummy")
        history = [{"role": "system", "content": "You are a coding agent. Use the tools."},
                   {"role": "user", "content": "Fix the docstring of sub in calc.py."}]
        first = client.chat.completions.create(model="local", messages=history, tools=TOOLS)
        msg = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [("read_file", {"path": "calc.py"})]
        history += [msg.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": CALC}]
        second = client.chat.completions.create(model="local", messages=history, tools=TOOLS)
        call = second.choices[0].message.tool_calls[0]
        assert call.function.name == "write_file" and "may be negative" in json.loads(call.function.arguments)["content"]
        history += [second.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
        third = client.chat.completions.create(model="local", messages=history, tools=TOOLS)
        assert third.choices[0].message.content == "Done." and not third.choices[0].message.tool_calls
    finally:
        interrupt(proc, timeout=30)


def test_drafter_arm_loads_the_shipped_drafter_and_emits_the_record(loaded_model):
    """`drafter` is a method arm (engine/methods/registry.py): its engine alone loads the drafter
    shipped for the default model, drafts on the recorded turns and stays exact; the
    ordinary arm's engine has no drafter."""
    doc = replay([small_session()], ReplayOptions(parse_arms("drafter")), loaded_model)
    assert doc["arms"] == ["ordinary", "drafter"]
    turns = doc["sessions"][0]["turns"]
    drafted = sum(t["arms"]["drafter"]["tokens_by_kind"].get("drafter", 0) for t in turns)
    assert all(t["arms"][a]["identical"] for t in turns for a in ("ordinary", "drafter"))
    assert drafted > 0  # the drafter's tokens were accepted somewhere in two tool-call turns
    assert all("drafter" not in t["arms"]["ordinary"]["tokens_by_kind"] for t in turns)


def test_drafter_arm_refuses_a_drafter_of_another_model(loaded_model, tmp_path):
    from jumpahead.engine.methods.drafter import DrafterError, default_drafter_path
    from jumpahead.engine.methods.registry import MethodError
    import shutil

    other = tmp_path / "other"
    shutil.copytree(default_drafter_path(), other)
    meta = json.loads((other / "drafter.json").read_text())
    meta["target"] = {**meta["target"], "vocab": 7}
    (other / "drafter.json").write_text(json.dumps(meta))
    with pytest.raises(MethodError, match="another model") as refused:
        replay([small_session()], ReplayOptions(parse_arms("drafter"), drafter=str(other)), loaded_model)
    assert isinstance(refused.value.__cause__, DrafterError)
