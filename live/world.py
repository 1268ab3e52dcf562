"""A world of small coding-agent tasks, each with an independent check.

`make_task(seed, kind)` builds a deterministic task: the user's prompt, the files the
workspace starts with (`setup`), and `check(workspace, final_answer)`, which decides
success from the workspace alone; only `run_command` looks at the final answer, for
the command's output. Each task also carries an ideal solution (`ideal`: the tool
calls, `answer`: a final answer) used by the tests and by the synthetic trajectories.

Single-step kinds need one tool call; `copy_function` needs a read first (2 calls);
multi-step kinds chain two calls. `split_seeds("train"|"heldout", n)` gives disjoint
seed ranges: training data never sees a held-out task.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

KINDS: tuple[str, ...] = (
    "create_file", "append_line", "replace_line", "fix_typo", "copy_function", "run_command",
    "read_then_edit", "create_two_files",
)
SINGLE_STEP: tuple[str, ...] = ("create_file", "append_line", "replace_line", "fix_typo", "run_command")

_SPLITS = {"train": 0, "heldout": 1_000_000}  # disjoint ranges of 1e6 seeds each
SPLIT_SIZE = 1_000_000

WORDS = (
    "apple river stone cloud green orange table window garden silver paper yellow rocket "
    "forest bridge candle pepper winter summer island planet violet copper marble shadow "
    "meadow harbor lantern falcon tiger maple cedar ocean desert thunder pillow button "
    "velvet ginger coffee basket ladder mirror pencil rabbit salmon tomato walnut zebra "
    "anchor blossom castle dragon engine feather glacier hammer"
).split()
DIRS = ("", "", "", "docs/", "src/", "notes/")
EXTS = (".txt", ".md", ".txt", ".cfg")
TYPOS = (("return", "retrun"), ("length", "lenght"), ("receive", "recieve"), ("result", "reslut"),
         ("print", "pirnt"), ("value", "valeu"), ("number", "nubmer"), ("total", "totla"),
         ("count", "conut"), ("width", "widht"), ("height", "hieght"), ("string", "strnig"))


@dataclass
class Task:
    seed: int
    kind: str
    prompt: str  # the user message
    steps: int  # tool calls an ideal solution needs
    files: dict[str, str] = field(default_factory=dict)  # the workspace at the start
    ideal: list[tuple[str, dict]] = field(default_factory=list)  # (tool name, arguments) in order
    answer: str = ""  # an ideal final answer
    _check: Callable[[Path, str], bool] | None = field(default=None, repr=False)

    def setup(self, workspace: Path) -> None:
        """Write the task's starting files into `workspace`."""
        for rel, text in self.files.items():
            path = Path(workspace) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def check(self, workspace: Path, final_answer: str) -> bool:
        """Whether the task is done, judged from the workspace (and, for run_command,
        the final answer's report of the output)."""
        if self._check is None:
            return False
        try:
            return bool(self._check(Path(workspace), final_answer or ""))
        except (OSError, UnicodeError, ValueError):
            return False


def split_seeds(split: str, n: int) -> list[int]:
    """`n` seeds of a split ("train" or "heldout"); the two ranges never overlap."""
    if split not in _SPLITS:
        raise ValueError(f"unknown split {split!r}: expected one of {', '.join(_SPLITS)}")
    if not 0 <= n <= SPLIT_SIZE:
        raise ValueError(f"n must be in 0..{SPLIT_SIZE}")
    base = _SPLITS[split]
    return list(range(base, base + n))


def make_task(seed: int, kind: str | None = None) -> Task:
    """The task of `seed` (its kind cycles through KINDS unless given)."""
    if kind is None:
        kind = KINDS[seed % len(KINDS)]
    if kind not in _MAKERS:
        raise ValueError(f"unknown task kind {kind!r}: expected one of {', '.join(KINDS)}")
    rng = random.Random(f"jumpahead-live:{kind}:{seed}")
    task = _MAKERS[kind](rng)
    task.seed, task.kind = seed, kind
    return task


# --- helpers ----------------------------------------------------------------------------


def _read(ws: Path, rel: str) -> str | None:
    path = ws / rel
    return path.read_text() if path.is_file() else None


def _same_text(actual: str | None, expected: str) -> bool:
    """Equal up to trailing newlines / spaces at the end of lines."""
    if actual is None:
        return False
    norm = lambda s: "\n".join(line.rstrip() for line in s.rstrip("\n").split("\n"))  # noqa: E731
    return norm(actual) == norm(expected)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.sample(WORDS, n))


def _path(rng: random.Random, ext: str | None = None) -> str:
    return f"{rng.choice(DIRS)}{rng.choice(WORDS)}{ext or rng.choice(EXTS)}"


def _lines(rng: random.Random, n: int) -> list[str]:
    return [_words(rng, rng.randint(2, 4)) for _ in range(n)]


def _text_of(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _function(rng: random.Random, name: str) -> str:
    arg = rng.choice(("x", "n", "value", "a"))
    k, c = rng.randint(2, 9), rng.randint(1, 20)
    body = rng.choice((f"return {arg} * {k} + {c}", f"return {arg} - {c}", f"return ({arg} + {c}) // {k}"))
    return f"def {name}({arg}):\n    {body}\n"


def _fn_name(rng: random.Random) -> str:
    return f"{rng.choice(('get', 'make', 'scale', 'count', 'load', 'find'))}_{rng.choice(WORDS)}"


def _task(prompt: str, steps: int, files: dict[str, str], ideal: list[tuple[str, dict]], answer: str,
          check: Callable[[Path, str], bool]) -> Task:
    return Task(seed=0, kind="", prompt=prompt, steps=steps, files=files, ideal=ideal, answer=answer,
                _check=check)


def _unchanged(files: dict[str, str], *skip: str) -> Callable[[Path], bool]:
    """The starting files other than `skip` still hold their text."""
    return lambda ws: all(_read(ws, rel) == text for rel, text in files.items() if rel not in skip)


# --- kinds ------------------------------------------------------------------------------


def _create_file(rng: random.Random) -> Task:
    path = _path(rng)
    content = _text_of(_lines(rng, rng.randint(1, 3)))
    prompt = f"Create the file {path} with this content:\n```\n{content}```"
    return _task(prompt, 1, {}, [("write_file", {"path": path, "content": content})],
                 f"Created {path}.", lambda ws, _a: _same_text(_read(ws, path), content))


def _append_line(rng: random.Random) -> Task:
    path = _path(rng, ".txt")
    lines = _lines(rng, rng.randint(2, 4))
    line = _words(rng, 3)
    files = {path: _text_of(lines)}
    prompt = f"Append the line `{line}` to {path}."
    return _task(prompt, 1, files, [("bash", {"command": f"echo '{line}' >> {path}"})],
                 f"Appended `{line}` to {path}.",
                 lambda ws, _a: _same_text(_read(ws, path), _text_of([*lines, line])))


def _replace_line(rng: random.Random) -> Task:
    path = rng.choice(("config.txt", "settings.cfg", "app.cfg", "setup.txt"))
    keys = rng.sample(("mode", "color", "level", "name", "theme", "size", "user", "style"), 4)
    lines = [f"{k} = {rng.choice(WORDS)}" for k in keys]
    i = rng.randrange(len(lines))
    old = lines[i]
    new = f"{keys[i]} = {rng.choice([w for w in WORDS if w not in old])}"
    files = {path: _text_of(lines)}
    expected = _text_of([new if j == i else line for j, line in enumerate(lines)])
    prompt = f"In {path}, replace the line `{old}` with `{new}`."
    return _task(prompt, 1, files, [("edit_file", {"path": path, "old": old, "new": new})],
                 f"Replaced `{old}` with `{new}` in {path}.",
                 lambda ws, _a: _same_text(_read(ws, path), expected))


def _fix_typo(rng: random.Random) -> Task:
    good, bad = rng.choice(TYPOS)
    path = rng.choice(("notes.txt", "readme.md", "todo.txt", "guide.md"))
    lines = _lines(rng, rng.randint(2, 4))
    i = rng.randrange(len(lines))
    words = lines[i].split()
    words.insert(rng.randint(0, len(words)), bad)
    broken = list(lines)
    broken[i] = " ".join(words)
    fixed = list(lines)
    fixed[i] = " ".join(good if w == bad else w for w in words)
    files = {path: _text_of(broken)}
    prompt = f"{path} has a typo: `{bad}` should be `{good}`. Fix it."
    return _task(prompt, 1, files, [("edit_file", {"path": path, "old": bad, "new": good})],
                 f"Fixed the typo in {path}: `{bad}` is now `{good}`.",
                 lambda ws, _a: _same_text(_read(ws, path), _text_of(fixed)))


def _copy_function(rng: random.Random) -> Task:
    src = rng.choice(("utils.py", "helpers.py", "lib.py", "tools.py"))
    dst = rng.choice([p for p in ("main.py", "extra.py", "copy.py", "app.py") if p != src])
    names: list[str] = []
    while len(names) < 3:
        name = _fn_name(rng)
        if name not in names:
            names.append(name)
    functions = [_function(rng, n) for n in names]
    pick = rng.randrange(3)
    files = {src: "\n\n".join(functions)}
    prompt = f"Copy the function {names[pick]} from {src} into a new file {dst}."
    unchanged = _unchanged(files)
    return _task(prompt, 2, files,
                 [("read_file", {"path": src}), ("write_file", {"path": dst, "content": functions[pick]})],
                 f"Copied {names[pick]} from {src} into {dst}.",
                 lambda ws, _a: unchanged(ws) and _contains_block(_read(ws, dst), functions[pick]))


def _contains_block(text: str | None, block: str) -> bool:
    if text is None:
        return False
    norm = lambda s: "\n".join(line.rstrip() for line in s.strip("\n").split("\n"))  # noqa: E731
    return norm(block) in norm(text)


def _run_command(rng: random.Random) -> Task:
    path = rng.choice(("calc.py", "count.py", "show.py", "main.py"))
    nums = [rng.randint(2, 99) for _ in range(rng.randint(2, 4))]
    form = rng.randrange(3)
    if form == 0:
        code, output = f"print(sum({nums}))\n", str(sum(nums))
    elif form == 1:
        code, output = f"print({nums[0]} * {nums[1]})\n", str(nums[0] * nums[1])
    else:
        word = rng.choice(WORDS)
        code, output = f"print({word!r}.upper() + '-' + str({nums[0]} + {nums[-1]}))\n", \
            f"{word.upper()}-{nums[0] + nums[-1]}"
    files = {path: code}
    command = f"python3 {path}"
    prompt = f"Run `{command}` and tell me what it prints."
    unchanged = _unchanged(files)
    return _task(prompt, 1, files, [("bash", {"command": command})], f"It prints:\n```\n{output}\n```",
                 lambda ws, answer: unchanged(ws) and output in answer)


def _read_then_edit(rng: random.Random) -> Task:
    path = rng.choice(("settings.ini", "server.cfg", "app.ini", "env.cfg"))
    keys = rng.sample(("port", "host", "timeout", "retries", "workers", "cache", "debug", "region"), 4)
    sep = rng.choice((" = ", "=", ": "))
    values = {k: (str(rng.randint(10, 9999)) if k in ("port", "timeout", "retries", "workers") else rng.choice(WORDS))
              for k in keys}
    lines = [f"{k}{sep}{values[k]}" for k in keys]
    i = rng.randrange(len(lines))
    key = keys[i]
    while True:
        value = str(rng.randint(10, 9999)) if values[key].isdigit() else rng.choice(WORDS)
        if value != values[key]:
            break
    files = {path: _text_of(lines)}
    new_line = f"{key}{sep}{value}"
    expected = _text_of([new_line if j == i else line for j, line in enumerate(lines)])
    prompt = f"Set {key} to {value} in {path}."
    return _task(prompt, 2, files,
                 [("read_file", {"path": path}), ("edit_file", {"path": path, "old": lines[i], "new": new_line})],
                 f"Set {key} to {value} in {path}.", lambda ws, _a: _same_text(_read(ws, path), expected))


def _create_two_files(rng: random.Random) -> Task:
    first = _path(rng, ".txt")
    second = first
    while second == first:
        second = _path(rng, ".txt")
    a, b = _words(rng, rng.randint(2, 4)), _words(rng, rng.randint(2, 4))
    prompt = f"Create two files: {first} containing `{a}` and {second} containing `{b}`."
    return _task(prompt, 2, {},
                 [("write_file", {"path": first, "content": a + "\n"}),
                  ("write_file", {"path": second, "content": b + "\n"})],
                 f"Created {first} and {second}.",
                 lambda ws, _a: _same_text(_read(ws, first), a) and _same_text(_read(ws, second), b))


_MAKERS: dict[str, Callable[[random.Random], Task]] = {
    "create_file": _create_file,
    "append_line": _append_line,
    "replace_line": _replace_line,
    "fix_typo": _fix_typo,
    "copy_function": _copy_function,
    "run_command": _run_command,
    "read_then_edit": _read_then_edit,
    "create_two_files": _create_two_files,
}
assert set(_MAKERS) == set(KINDS)
