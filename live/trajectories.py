"""Synthetic agent conversations for teaching the default model to act in the task world.

Each trajectory is an OpenAI chat conversation: the system prompt, the task's prompt,
then assistant turns that say in a sentence or two what they do (the content a later
call copies is stated in a fenced block whose lead names its file: what the online jump
policy reads, policies/jump_sources.py) and make one tool call, the tool's real result
(every call is executed in a sandboxed workspace, and the finished workspace must pass
the task's check), and a short final answer.

The reasoning is plain text before the call, not a `<think>` block: the default model's
template has no reasoning slot, so a `<think>` block would be parsed out as reasoning
and dropped from the history the client sends back; plain text survives the round
trip and the model sees the same history in training and in serving.

Tool results show what a call did (live/sandbox.py: a write's or an edit's changed
lines, a command's output and failing status), so a trajectory can check its work and
repair what the result shows. Variants, drawn per seed (`choose_variant`): `clean` (the
ideal calls; the rest, about 1 - VERIFY_SHARE - RECOVERY_SHARE of the trajectories
where a check and a mistake apply), `verify` (VERIFY_SHARE: after a write or an edit the
work is checked, found right: a Python file is run, another file read back, an appended
line shown with `cat`), and recoveries (RECOVERY_SHARE), where a result shows a wrong or
partial action and the next turn repairs it: `write_typo` / `write_truncated` (the
write's own snippet shows a misspelt or missing line), `edit_typo` (the edit's snippet
shows a misspelt new line), `append_typo` (a `cat` after an append shows a misspelt
line: an append prints nothing), `edit_miss` (edit_file old text not found),
`wrong_path` (the write went to another file), `bad_command` (the command named a
missing file).

Long kinds (world.LONG_KINDS) open with a numbered plan before the first call, state
each written file's full draft in the turn that writes it (as `say` does for every
kind), and their ideal calls already read files back and run the check command after
writing. Their own recovery, `skip_edit`: one edit of a Python file is left out, the
check command's result shows it (a failing test, an old name grep still finds), and the
next turns make the missed edit and run the check again.

Trajectories are built from training seeds only (training/train.py `write_data`), and a
training seed's words and numbers never occur in a held-out task (world.SHORT_VOCAB,
world.VOCAB): what the adapter learns to write is never a held-out task's content.

`write_jsonl` writes `{"messages": [...], "tools": [...]}` lines, the chat format
mlx-lm's LoRA trainer reads (mlx_lm/tuner/datasets.py ChatDataset).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .sandbox import SYSTEM_PROMPT, TOOLS, run_tool, workspace
from .world import LONG_KINDS, Task, make_task

VARIANTS: tuple[str, ...] = ("clean", "verify", "edit_miss", "write_typo", "write_truncated", "wrong_path",
                             "edit_typo", "append_typo", "bad_command", "skip_edit")
# shares of the trajectories of a task (where such a variant applies): a mistake the
# result reveals and its repair, and a check of finished work that finds it right
RECOVERY_SHARE = 0.3
VERIFY_SHARE = 0.2


def applicable(task: Task) -> list[str]:
    """The variants that make sense for `task`."""
    names = {name for name, _ in task.ideal}
    out = ["clean"]
    if task.kind not in LONG_KINDS and ({"write_file", "edit_file"} & names or _appends(task)):
        out.append("verify")
    if "write_file" in names:
        out += ["write_typo", "wrong_path"]
        if any(a["content"].count("\n") >= 2 for n, a in task.ideal if n == "write_file"):
            out.append("write_truncated")
    if "edit_file" in names:
        out.append("edit_miss")
        # (not fix_typo: a misspelt fix can be the very typo the task is about)
        if task.kind not in (*LONG_KINDS, "fix_typo") and any(_spots(a["new"]) for n, a in task.ideal
                                                               if n == "edit_file"):
            out.append("edit_typo")
    if _appends(task):
        out.append("append_typo")
    if task.kind == "run_command":
        out.append("bad_command")
    if task.kind in LONG_KINDS and _skippable(task):
        out.append("skip_edit")
    return out


def _appends(task: Task) -> list[int]:
    """Indices of the ideal calls that append a line with `echo '...' >> path`."""
    return [i for i, (n, a) in enumerate(task.ideal) if n == "bash" and _APPEND.fullmatch(a["command"])]


_APPEND = re.compile(r"echo '([^']*)' >> (\S+)")


def _skippable(task: Task) -> list[int]:
    """Indices of a long task's edits of Python files that a later bash check follows."""
    last_bash = max((i for i, (n, _) in enumerate(task.ideal) if n == "bash"), default=-1)
    return [i for i, (n, a) in enumerate(task.ideal)
            if n == "edit_file" and a["path"].endswith(".py") and i < last_bash]


def choose_variant(task: Task, rng: random.Random) -> str:
    options = applicable(task)
    recoveries = [v for v in options if v not in ("clean", "verify")]
    r = rng.random()
    if recoveries and r < RECOVERY_SHARE:
        return rng.choice(recoveries)
    if "verify" in options and r < RECOVERY_SHARE + VERIFY_SHARE:
        return "verify"
    return "clean"


# --- what the assistant says before a call ------------------------------------------------


def fence(text: str) -> str:
    """A fenced block of `text` (its final newline kept inside the fence)."""
    body = text if text.endswith("\n") else text + "\n"
    return f"```\n{body}```"


def say(name: str, args: dict[str, Any]) -> str:
    """The sentence(s) before a call: what it does, with any content it writes stated."""
    if name == "write_file":
        return f"I write {args['path']} with:\n{fence(args['content'])}"
    if name == "edit_file":
        old, new = args["old"], args["new"]
        if "\n" in old or "\n" in new:
            return f"In {args['path']} I replace\n{fence(old)}\nwith\n{fence(new)}"
        return f"In {args['path']} I replace `{old}` with `{new}`."
    if name == "read_file":
        return f"I read {args['path']}."
    return f"I run `{args['command']}`."


def plan(task: Task) -> str:
    """A numbered plan of a long task's ideal calls: runs of one tool make one step."""
    steps: list[str] = []
    groups: list[tuple[str, list[dict[str, Any]]]] = []
    for name, args in task.ideal:
        if groups and groups[-1][0] == name and name != "bash":
            groups[-1][1].append(args)
        else:
            groups.append((name, [args]))
    for name, group in groups:
        paths = list(dict.fromkeys(a.get("path", "") for a in group))
        if name == "bash":
            steps.append(f"Run `{group[0]['command']}`.")
        elif name == "read_file":
            steps.append(f"Read {', '.join(paths)}.")
        elif name == "write_file":
            steps.append(f"Write {', '.join(paths)}.")
        else:
            n = len(group)
            steps.append(f"Edit {', '.join(paths)} ({n} change{'s' if n != 1 else ''}).")
    return "Plan:\n" + "".join(f"{i}. {step}\n" for i, step in enumerate(steps, 1))


# --- building a conversation ------------------------------------------------------------


class _Recorder:
    """Runs calls in a workspace and records the conversation."""

    def __init__(self, task: Task, ws: Path) -> None:
        self.ws = ws
        self.snippets = task.snippets
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.prompt},
        ]
        self.n = 0
        self.mistakes: list[int] = []  # indices of assistant messages that carry a mistake

    def call(self, name: str, args: dict[str, Any], text: str | None = None, mistake: bool = False) -> str:
        self.n += 1
        if mistake:  # the trainer does not learn this turn: only the recovery from it
            self.mistakes.append(len(self.messages))
        call_id = f"call_{self.n}"
        self.messages.append({
            "role": "assistant",
            "content": say(name, args) if text is None else text,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)}}],
        })
        result = run_tool(self.ws, name, args, self.snippets)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result})
        return result

    def answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


def _spots(content: str) -> list[tuple[int, int, int]]:
    """(line, word, letter) where swapping letter and letter+1 misspells a word."""
    return [(i, j, k) for i, line in enumerate(content.split("\n")) for j, w in enumerate(line.split(" "))
            if len(w) >= 4 and w.isalpha() for k in range(1, len(w) - 2) if w[k] != w[k + 1]]


def _misspell(rng: random.Random, content: str) -> tuple[str, str, str] | None:
    """(bad content, bad line, good line): one word of one line with two letters swapped."""
    lines = content.split("\n")
    spots = _spots(content)
    if not spots:
        return None
    i, j, k = rng.choice(spots)
    words = lines[i].split(" ")
    w = words[j]
    words[j] = w[:k] + w[k + 1] + w[k] + w[k + 2:]
    bad_lines = list(lines)
    bad_lines[i] = " ".join(words)
    return "\n".join(bad_lines), bad_lines[i], lines[i]


def _wrong_old(rng: random.Random, old: str) -> str:
    """Old text the model misremembered: other spacing or a dropped letter."""
    if " = " in old:
        return old.replace(" = ", "=", 1)
    if "=" in old:
        return old.replace("=", " = ", 1)
    letters = [i for i, c in enumerate(old) if c.isalpha()]
    i = rng.choice(letters[1:] or letters or [0])
    return old[:i] + old[i + 1:] if len(old) > 1 else old + "x"


def build(task: Task, variant: str = "clean", seed: int | None = None) -> dict[str, Any]:
    """One trajectory of `task`: {"messages", "tools", "kind", "variant"}. Raises
    ValueError when the variant does not apply or the result fails the task's check."""
    if variant not in applicable(task):
        raise ValueError(f"variant {variant!r} does not apply to a {task.kind} task")
    rng = random.Random(f"traj:{task.seed}:{task.kind}:{variant}:{seed}")
    with workspace(prefix="jumpahead-traj-") as ws:
        task.setup(ws)
        rec = _Recorder(task, ws)
        answer = task.answer
        # the step where the variant's mistake happens
        targets = {"write_typo": "write_file", "write_truncated": "write_file", "wrong_path": "write_file",
                   "edit_miss": "edit_file", "edit_typo": "edit_file", "bad_command": "bash"}
        target = targets.get(variant)
        candidates = [i for i, (n, a) in enumerate(task.ideal) if n == target
                      and (variant != "write_truncated" or a["content"].count("\n") >= 2)
                      and (variant != "edit_typo" or _spots(a["new"]))]
        if variant == "verify":  # the last write, edit or append: the check follows the finished work
            candidates = [i for i, (n, a) in enumerate(task.ideal) if n in ("write_file", "edit_file")][-1:] \
                or _appends(task)[-1:]
        if variant == "append_typo":
            candidates = _appends(task)
        at = rng.choice(candidates) if candidates else -1
        read_paths: set[str] = set()
        if variant == "skip_edit":
            _skip_edit(rec, task, rng)
        for i, (name, args) in enumerate(task.ideal if variant != "skip_edit" else ()):
            opening = plan(task) + "\n" + say(name, args) if i == 0 and task.kind in LONG_KINDS else None
            if i != at:
                rec.call(name, args, opening)
                if name == "read_file":
                    read_paths.add(args["path"])
                continue
            _variant_step(rec, variant, name, args, rng, read_paths)
        rec.answer(answer)
        if not task.check(ws, answer):
            raise ValueError(f"trajectory {variant} of {task.kind} seed {task.seed} fails its check")
    return {"messages": rec.messages, "tools": TOOLS, "kind": task.kind, "variant": variant,
            "mistakes": rec.mistakes}


def _skip_edit(rec: _Recorder, task: Task, rng: random.Random) -> None:
    """The ideal calls with one Python edit left out until the next check shows it."""
    with workspace(prefix="jumpahead-traj-") as scratch:  # the check results of the ideal run
        task.setup(scratch)
        ideal_results = [run_tool(scratch, name, args, task.snippets) for name, args in task.ideal]
    skip = rng.choice(_skippable(task))
    check_at = next(i for i, (n, _) in enumerate(task.ideal) if n == "bash" and i > skip)
    for i, (name, args) in enumerate(task.ideal):
        if i == skip:
            continue
        text = plan(task) + "\n" + say(name, args) if i == 0 else None
        mistake = i == skip + 1  # the turn that moved on without the edit
        result = rec.call(name, args, text, mistake=mistake)
        if i != check_at:
            continue
        if result == ideal_results[i]:
            raise ValueError("the check does not show the skipped edit")
        missed = task.ideal[skip][1]
        rec.call("edit_file", missed, f"`{args['command']}` shows that {missed['path']} still needs a change "
                                      f"I left out.\n{say('edit_file', missed)}")
        rec.call(name, args, f"I run `{args['command']}` again to check.")


def _check_work(rec: _Recorder, name: str, args: dict[str, Any]) -> None:
    """A check of a finished write, edit or append: a Python file is run (its functions
    called), another file read back or, after an append, shown with `cat`."""
    if name == "bash":
        path = _APPEND.fullmatch(args["command"]).group(2)
        rec.call("bash", {"command": f"cat {path}"}, f"I check {path} with `cat`.")
        return
    path = args["path"]
    names = re.findall(r"^def (\w+)\(", args.get("content", ""), re.M)
    if path.endswith(".py") and "/" not in path and names:
        calls = ", ".join(f"{n}(3)" for n in names)
        command = f"python3 -c 'from {path[:-3]} import {', '.join(names)}; print({calls})'"
        rec.call("bash", {"command": command}, f"I run {path} to check it: `{command}`.")
        return
    rec.call("read_file", {"path": path}, f"I read {path} back to check it.")


def _variant_step(rec: _Recorder, variant: str, name: str, args: dict[str, Any], rng: random.Random,
                  read_paths: set[str]) -> None:
    path = args.get("path", "")
    if variant == "verify":
        rec.call(name, args)
        _check_work(rec, name, args)
        return
    if variant == "append_typo":
        line, path = _APPEND.fullmatch(args["command"]).groups()
        spoiled = _misspell(rng, line)
        if spoiled is None:
            raise ValueError("no word to misspell")
        bad_line = spoiled[0]
        rec.call(name, {"command": f"echo '{bad_line}' >> {path}"}, mistake=True)
        rec.call("bash", {"command": f"cat {path}"}, f"I check {path} with `cat`.")
        rec.call("edit_file", {"path": path, "old": bad_line, "new": line},
                 f"The last line of {path} is `{bad_line}`, not `{line}`. I fix it.")
        return
    if variant == "edit_typo":
        spoiled = _misspell(rng, args["new"])
        if spoiled is None:
            raise ValueError("no word to misspell")
        bad_new = spoiled[0]
        rec.call(name, {**args, "new": bad_new}, mistake=True)
        fix = {"path": path, "old": spoiled[1], "new": spoiled[2]}
        rec.call("edit_file", fix, f"The result shows `{spoiled[1]}` where it should say `{spoiled[2]}`. I fix it.")
        return
    if variant == "write_typo":
        spoiled = _misspell(rng, args["content"])
        if spoiled is None:
            raise ValueError("no word to misspell")
        bad_content, bad_line, good_line = spoiled
        rec.call(name, {**args, "content": bad_content}, mistake=True)
        fix = {"path": path, "old": bad_line, "new": good_line}
        rec.call("edit_file", fix, f"The result shows `{bad_line}` in {path} where it should say `{good_line}`. "
                                   f"I fix it.")
        return
    if variant == "write_truncated":
        lines = args["content"].rstrip("\n").split("\n")
        cut = "".join(line + "\n" for line in lines[:-1])
        rec.call(name, {**args, "content": cut}, mistake=True)
        rec.call(name, args, f"The result shows that the line `{lines[-1]}` is missing from {path}. "
                             f"I write the file again.\n{say(name, args)}")
        return
    if variant == "wrong_path":
        stem, dot, ext = path.rpartition("/")[2].partition(".")
        wrong = path.replace(stem, stem[:-1] if len(stem) > 3 else stem + "s", 1)
        rec.call(name, {**args, "path": wrong}, mistake=True)
        rec.call(name, args, f"That went to {wrong}, but the task asks for {path}. "
                             f"I write {path}.\n{say(name, args)}")
        return
    if variant == "edit_miss":
        text = (rec.ws / path).read_text()
        olds = [_wrong_old(rng, args["old"]) for _ in range(8)]
        olds = [o for o in olds if o and o not in text]
        if not olds:
            raise ValueError("could not make a wrong old text")
        wrong = {**args, "old": olds[0]}
        rec.call(name, wrong, mistake=True)
        if path not in read_paths:
            rec.call("read_file", {"path": path}, f"The old text was not found. I read {path} to see its exact text.")
            rec.call(name, args)
        else:
            rec.call(name, args, f"The old text was not found; the line in {path} is `{args['old']}`.\n"
                                 f"{say(name, args)}")
        return
    if variant == "bad_command":
        command = args["command"]
        prog, _, file = command.partition(" ")
        stem, dot, ext = file.partition(".")
        bad = f"{prog} {stem[:-1]}{dot}{ext}"
        rec.call(name, {"command": bad}, mistake=True)
        rec.call(name, args, f"There is no file {stem[:-1]}{dot}{ext}; the task names {file}. "
                             f"I run `{command}`.")
        return
    raise ValueError(f"unknown variant {variant!r}")


def generate(seeds: Iterable[int], long_share: float = 0.0) -> list[dict[str, Any]]:
    """One trajectory per seed, its variant drawn per seed (deterministic). A seed makes a
    long-kind task (cycling LONG_KINDS) with probability `long_share`, else its short one."""
    out = []
    for seed in seeds:
        long = random.Random(f"long:{seed}").random() < long_share
        task = make_task(seed, LONG_KINDS[seed % len(LONG_KINDS)] if long else None)
        rng = random.Random(f"variant:{seed}")
        variant = choose_variant(task, rng)
        try:
            out.append(build(task, variant, seed))
        except ValueError:
            out.append(build(task, "clean", seed))
    return out


def training_record(trajectory: dict[str, Any]) -> dict[str, Any]:
    """What the trainer reads: messages and tools (mlx-lm's chat format), plus
    `no_loss`: the indices of assistant messages that make the mistake a recovery
    repairs (jumpahead's trainer learns every other assistant message; mlx-lm's own
    `mlx_lm.lora --data` ignores the key)."""
    return {"messages": trajectory["messages"], "tools": trajectory["tools"],
            "no_loss": list(trajectory.get("mistakes", []))}


def write_jsonl(path: Path, trajectories: Iterable[dict[str, Any]]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w") as f:
        for t in trajectories:
            f.write(json.dumps(training_record(t)) + "\n")
            n += 1
    return n
