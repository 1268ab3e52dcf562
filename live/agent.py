"""A minimal agent loop: one task through a real server, over the OpenAI protocol.

The loop is an ordinary client (the `openai` SDK): system prompt, the task's prompt,
the sandbox's TOOLS; then chat.completions.create -> run each tool call in the task's
workspace (live/sandbox.py run_tool) -> append the results -> again, until the model
answers without a tool call (its final answer), the step limit, or the task's
wall-clock timeout. It never reaches into the engine: what it knows of the server is
what a response carries (`usage`, `usage.fill` with the policies' interventions).

`run_task` returns a TaskRecord: success (Task.check on the workspace and the final
answer; a task that ends without a final answer, by the step limit, a timeout or an
error, or a last turn cut off by max_tokens, is a failure), wall time, turns, tokens, and per turn the server's fill
telemetry, the calls and whether their results were errors.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .ground_truth import expected_state, label_call, longest_repeat, snapshot, task_outcome
from .sandbox import SYSTEM_PROMPT, TOOLS, run_tool
from .world import LONG_KINDS, Task

from .oracle import HINDSIGHT_FIELD, ORACLE_FIELD, hindsight_output

DEFAULT_MAX_STEPS = 6
DEFAULT_MAX_TOKENS = 256
DEFAULT_TIMEOUT_S = 300.0
RESULT_KEEP = 300  # tool-result characters kept per call in the record
STEP_SLACK = 4  # model turns a long task gets beyond its ideal calls
LONG_TURN_TOKENS = 768  # tokens per turn at least, for a long kind's turns that draft a whole file


def budget(task: Task, options: AgentOptions) -> tuple[int, int, float]:
    """(model turns, tokens per turn, wall-clock seconds) for `task`. A short kind gets the
    options as they are; a long kind (14-27 ideal calls) gets at least its ideal calls plus
    STEP_SLACK turns, with the timeout scaled by the same factor, and LONG_TURN_TOKENS."""
    if task.kind not in LONG_KINDS:
        return options.max_steps, options.max_tokens, options.timeout_s
    turns = max(options.max_steps, task.steps + STEP_SLACK)
    return turns, max(options.max_tokens, LONG_TURN_TOKENS), options.timeout_s * turns / options.max_steps


@dataclass
class AgentOptions:
    model: str = "jumpahead"
    max_steps: int = DEFAULT_MAX_STEPS  # model turns per task
    max_tokens: int = DEFAULT_MAX_TOKENS  # per turn
    timeout_s: float = DEFAULT_TIMEOUT_S  # per task, wall clock
    temperature: float = 0.0  # greedy: arms with exact methods reproduce ordinary decoding
    system_prompt: str = SYSTEM_PROMPT


@dataclass
class TurnRecord:
    wall_s: float
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    fill: dict[str, Any]  # usage.fill as the server sent it (the engine's telemetry)
    content: str
    # name, arguments (text), result, error, and the ground truth (live/ground_truth.py):
    # truth (right | wrong | harmless), changed paths, bad_after
    calls: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)  # the server's, from its trace (live/command.py)
    report: dict[str, Any] = field(default_factory=dict)  # usage.report: the policies' report, interventions
    # the model's raw output in its own format (call markup included), from the server's
    # trace: the hindsight arm's recording of this turn (live/oracle.py)
    output: str = ""


@dataclass
class TaskRecord:
    arm: str
    seed: int
    kind: str
    steps: int  # tool calls of the task's ideal solution
    session: str
    success: bool = False
    status: str = "running"  # answered | truncated | step_limit | timeout | error
    error: str | None = None
    final_answer: str = ""
    wall_s: float = 0.0
    turns: list[TurnRecord] = field(default_factory=list)
    hindsight_turns: int | None = None  # hindsight arm: turns sent the ordinary arm's recording

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["n_turns"] = len(self.turns)
        out["prompt_tokens"] = sum(t.prompt_tokens for t in self.turns)
        out["completion_tokens"] = sum(t.completion_tokens for t in self.turns)
        out["cached_tokens"] = sum(t.cached_tokens for t in self.turns)
        calls = [c for t in self.turns for c in t.calls]
        out["truth_outcome"] = task_outcome(calls)
        out["longest_repeat"] = longest_repeat(calls)  # >= LOOP_REPEATS: the task looped
        return out


def ideal_calls(task: Task) -> list[dict[str, Any]]:
    """The task's ideal tool calls as `{"name", "arguments"}` (the live oracle's input)."""
    return [{"name": name, "arguments": dict(args)} for name, args in getattr(task, "ideal", []) or []]


def _arguments(text: str | None) -> tuple[dict[str, Any] | None, str | None]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        return None, f"Error: the arguments are not valid JSON ({exc.msg})"
    if not isinstance(value, dict):
        return None, "Error: arguments must be a JSON object"
    return value, None


def _usage(resp: Any) -> tuple[int, int, int, dict[str, Any], dict[str, Any]]:
    """Prompt, completion and cached tokens, `usage.fill` and `usage.report`."""
    usage = getattr(resp, "usage", None)
    if usage is None:
        return 0, 0, 0, {}, {}
    data = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
    details = data.get("prompt_tokens_details") or {}
    return (int(data.get("prompt_tokens") or 0), int(data.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0), dict(data.get("fill") or {}), dict(data.get("report") or {}))


def run_task(client: Any, task: Task, workspace: Path, arm_name: str, request_field: dict[str, Any],
             session: str, oracle: bool, options: AgentOptions,
             hindsight: list[dict[str, Any]] | None = None) -> TaskRecord:
    """Run `task` in `workspace` (set up here) against the server behind `client`.
    `hindsight`: the ordinary arm's turns of this seed (live/oracle.py recorded_turns);
    each request carries the next recorded output while this run is still on it."""
    record = TaskRecord(arm=arm_name, seed=task.seed, kind=task.kind, steps=task.steps, session=session)
    expected = expected_state(task)  # what the ideal solution leaves: each call is judged against it
    if hindsight is not None:
        record.hindsight_turns = 0
    task.setup(workspace)
    jumpahead = {**request_field, "session": session}
    if oracle:
        jumpahead[ORACLE_FIELD] = ideal_calls(task)
    messages: list[dict[str, Any]] = [{"role": "system", "content": options.system_prompt},
                                      {"role": "user", "content": task.prompt}]
    max_turns, max_tokens, timeout_s = budget(task, options)
    t0 = time.perf_counter()
    final: str | None = None
    try:
        for _ in range(max_turns):
            left = timeout_s - (time.perf_counter() - t0)
            if left <= 0:
                record.status = "timeout"
                break
            if hindsight is not None:
                jumpahead.pop(HINDSIGHT_FIELD, None)
                recorded = hindsight_output(hindsight, record.turns)
                if recorded is not None:
                    jumpahead[HINDSIGHT_FIELD] = recorded
                    record.hindsight_turns = (record.hindsight_turns or 0) + 1
            t_turn = time.perf_counter()
            resp = client.chat.completions.create(
                model=options.model, messages=messages, tools=TOOLS, max_tokens=max_tokens,
                temperature=options.temperature, timeout=left, extra_body={"jumpahead": jumpahead})
            msg = resp.choices[0].message
            prompt, completion, cached, fill, report = _usage(resp)
            turn = TurnRecord(wall_s=round(time.perf_counter() - t_turn, 4),
                              finish_reason=resp.choices[0].finish_reason, prompt_tokens=prompt,
                              completion_tokens=completion, cached_tokens=cached, fill=fill, report=report,
                              content=msg.content or "")
            record.turns.append(turn)
            calls = list(msg.tool_calls or [])
            if not calls:
                final = msg.content or ""
                break
            messages.append({"role": "assistant", "content": msg.content or "",
                             "tool_calls": [{"id": c.id, "type": "function",
                                             "function": {"name": c.function.name,
                                                          "arguments": c.function.arguments}} for c in calls]})
            for c in calls:
                args, problem = _arguments(c.function.arguments)
                before = snapshot(workspace)
                result = problem if args is None else run_tool(workspace, c.function.name, args, task.snippets)
                turn.calls.append({"name": c.function.name, "arguments": c.function.arguments,
                                   "error": result.startswith("Error"), "result": result[:RESULT_KEEP],
                                   **label_call(before, snapshot(workspace), expected, result)})
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
        else:
            record.status = "step_limit"
    except Exception as exc:  # a timeout or an HTTP error ends the task; it counts as a failure
        timed_out = "timeout" in type(exc).__name__.lower() or "timed out" in str(exc).lower()
        record.status = "timeout" if timed_out else "error"
        record.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    record.wall_s = round(time.perf_counter() - t0, 4)
    if final is not None and record.turns[-1].finish_reason == "length":
        record.status, record.final_answer = "truncated", final  # cut off mid-answer: no final answer
    elif final is not None:
        record.status, record.final_answer = "answered", final
        record.success = task.check(workspace, final)
    return record
