"""A world of small coding-agent tasks, each with an independent check.

`make_task(seed, kind)` builds a deterministic task: the user's prompt, the files the
workspace starts with (`setup`), and `check(workspace, final_answer)`, which decides
success from the workspace alone; only `run_command` looks at the final answer, for
the command's output, quoted exactly (`reports_output`; "142" does not report "42").
Every check compares text up to `normalize_text`, the one whitespace rule. Each task also carries an ideal solution (`ideal`: the tool
calls, `answer`: a final answer) used by the tests and by the synthetic trajectories.

Single-step kinds need one tool call; `copy_function` needs a read first (2 calls);
multi-step kinds chain two calls. `split_seeds("train"|"heldout", n)` gives disjoint
seed ranges, and the content is split with them (SHORT_VOCAB): a held-out seed's words
and numbers come from ranges no training seed draws from, so training data never sees a
held-out task nor any of its words or operands (tests/test_live_checked_work.py).

Long kinds (`LONG_KINDS`, 10-30 ideal calls over a small Python project): `add_feature`
(add a function to one module, register it in another, add a test, note it in the
changelog and README, run the tests) and `rename_symbol` (rename a function used across
4-8 files, then check with grep and by running the program). `make_task(seed)` cycles
only the short `KINDS`; a long kind is made when named. Their content is split too, not
only their seeds: a seed of the held-out range draws its package, module and function
names from `VOCAB["heldout"]`, a vocabulary that shares no word with `VOCAB["train"]`,
so no identifier of a held-out long task occurs in a training one. Their checks judge
the workspace by running the project (the tests, the registry, the program) in a
subprocess with a timeout, and by comparing files.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

KINDS: tuple[str, ...] = (
    "create_file", "append_line", "replace_line", "fix_typo", "copy_function", "run_command",
    "read_then_edit", "create_two_files",
)
LONG_KINDS: tuple[str, ...] = ("add_feature", "rename_symbol")
ALL_KINDS: tuple[str, ...] = KINDS + LONG_KINDS
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
# The short kinds' content is split like the long kinds' (VOCAB below): a held-out seed
# draws its words and its numbers from ranges no training seed uses, so no file line,
# value or program output of a held-out task occurs in a training trajectory.
SHORT_VOCAB: dict[str, dict[str, tuple]] = {
    "train": {"words": tuple(WORDS[0::2]), "nums": (2, 49), "ints": (100, 4999)},
    "heldout": {"words": tuple(WORDS[1::2]), "nums": (50, 99), "ints": (5000, 9999)},
}
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
    names: tuple[str, ...] = ()  # long kinds: the identifiers drawn from the split's vocabulary
    _check: Callable[[Path, str], bool] | None = field(default=None, repr=False)
    # Write/edit results show the changed lines (live/sandbox.py) for every kind, so a
    # wrong write is visible and can be repaired (issue 40). False gives the old bare
    # "Wrote N lines to X." text, only to reproduce runs of adapters trained on it.
    snippets: bool = True

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
        except (OSError, UnicodeError, ValueError, subprocess.SubprocessError):
            return False


def split_seeds(split: str, n: int) -> list[int]:
    """`n` seeds of a split ("train" or "heldout"); the two ranges never overlap."""
    if split not in _SPLITS:
        raise ValueError(f"unknown split {split!r}: expected one of {', '.join(_SPLITS)}")
    if not 0 <= n <= SPLIT_SIZE:
        raise ValueError(f"n must be in 0..{SPLIT_SIZE}")
    base = _SPLITS[split]
    return list(range(base, base + n))


def split_of(seed: int) -> str:
    """The split whose seed range holds `seed` (seeds below it count as train)."""
    return "heldout" if seed >= _SPLITS["heldout"] else "train"


def make_task(seed: int, kind: str | None = None) -> Task:
    """The task of `seed` (its kind cycles through the short KINDS unless given)."""
    if kind is None:
        kind = KINDS[seed % len(KINDS)]
    rng = random.Random(f"jumpahead-live:{kind}:{seed}")
    if kind in _MAKERS:
        task = _MAKERS[kind](rng, SHORT_VOCAB[split_of(seed)])
    elif kind in _LONG_MAKERS:
        task = _LONG_MAKERS[kind](rng, VOCAB[split_of(seed)])
    else:
        raise ValueError(f"unknown task kind {kind!r}: expected one of {', '.join(ALL_KINDS)}")
    task.seed, task.kind = seed, kind
    return task


# --- helpers ----------------------------------------------------------------------------


def _read(ws: Path, rel: str) -> str | None:
    path = ws / rel
    return path.read_text() if path.is_file() else None


def normalize_text(text: str) -> str:
    """What every check compares: the text without trailing spaces on its lines and
    without trailing newlines. The one definition of "the same text" (live/ground_truth.py
    judges calls with it too, so a check and ground truth never disagree on whitespace)."""
    return "\n".join(line.rstrip() for line in text.rstrip("\n").split("\n"))


def _same_text(actual: str | None, expected: str) -> bool:
    """Equal up to normalize_text."""
    return actual is not None and normalize_text(actual) == normalize_text(expected)


def _words(rng: random.Random, n: int, v: dict[str, tuple]) -> str:
    return " ".join(rng.sample(v["words"], n))


def _path(rng: random.Random, v: dict[str, tuple], ext: str | None = None) -> str:
    return f"{rng.choice(DIRS)}{rng.choice(v['words'])}{ext or rng.choice(EXTS)}"


def _lines(rng: random.Random, n: int, v: dict[str, tuple]) -> list[str]:
    return [_words(rng, rng.randint(2, 4), v) for _ in range(n)]


def _text_of(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _function(rng: random.Random, name: str) -> str:
    arg = rng.choice(("x", "n", "value", "a"))
    k, c = rng.randint(2, 9), rng.randint(1, 20)
    body = rng.choice((f"return {arg} * {k} + {c}", f"return {arg} - {c}", f"return ({arg} + {c}) // {k}"))
    return f"def {name}({arg}):\n    {body}\n"


def _fn_name(rng: random.Random, v: dict[str, tuple]) -> str:
    return f"{rng.choice(('get', 'make', 'scale', 'count', 'load', 'find'))}_{rng.choice(v['words'])}"


def _task(prompt: str, steps: int, files: dict[str, str], ideal: list[tuple[str, dict]], answer: str,
          check: Callable[[Path, str], bool]) -> Task:
    return Task(seed=0, kind="", prompt=prompt, steps=steps, files=files, ideal=ideal, answer=answer,
                _check=check)


def _unchanged(files: dict[str, str], *skip: str) -> Callable[[Path], bool]:
    """The starting files other than `skip` still hold their text."""
    return lambda ws: all(_read(ws, rel) == text for rel, text in files.items() if rel not in skip)


# --- kinds ------------------------------------------------------------------------------


def _create_file(rng: random.Random, v: dict[str, tuple]) -> Task:
    path = _path(rng, v)
    content = _text_of(_lines(rng, rng.randint(1, 3), v))
    prompt = f"Create the file {path} with this content:\n```\n{content}```"
    return _task(prompt, 1, {}, [("write_file", {"path": path, "content": content})],
                 f"Created {path}.", lambda ws, _a: _same_text(_read(ws, path), content))


def _append_line(rng: random.Random, v: dict[str, tuple]) -> Task:
    path = _path(rng, v, ".txt")
    lines = _lines(rng, rng.randint(2, 4), v)
    line = _words(rng, 3, v)
    files = {path: _text_of(lines)}
    prompt = f"Append the line `{line}` to {path}."
    return _task(prompt, 1, files, [("bash", {"command": f"echo '{line}' >> {path}"})],
                 f"Appended `{line}` to {path}.",
                 lambda ws, _a: _same_text(_read(ws, path), _text_of([*lines, line])))


def _replace_line(rng: random.Random, v: dict[str, tuple]) -> Task:
    path = rng.choice(("config.txt", "settings.cfg", "app.cfg", "setup.txt"))
    keys = rng.sample(("mode", "color", "level", "name", "theme", "size", "user", "style"), 4)
    lines = [f"{k} = {rng.choice(v['words'])}" for k in keys]
    i = rng.randrange(len(lines))
    old = lines[i]
    new = f"{keys[i]} = {rng.choice([w for w in v['words'] if w not in old])}"
    files = {path: _text_of(lines)}
    expected = _text_of([new if j == i else line for j, line in enumerate(lines)])
    prompt = f"In {path}, replace the line `{old}` with `{new}`."
    return _task(prompt, 1, files, [("edit_file", {"path": path, "old": old, "new": new})],
                 f"Replaced `{old}` with `{new}` in {path}.",
                 lambda ws, _a: _same_text(_read(ws, path), expected))


def _fix_typo(rng: random.Random, v: dict[str, tuple]) -> Task:
    good, bad = rng.choice(TYPOS)
    path = rng.choice(("notes.txt", "readme.md", "todo.txt", "guide.md"))
    lines = _lines(rng, rng.randint(2, 4), v)
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


def _copy_function(rng: random.Random, v: dict[str, tuple]) -> Task:
    src = rng.choice(("utils.py", "helpers.py", "lib.py", "tools.py"))
    dst = rng.choice([p for p in ("main.py", "extra.py", "copy.py", "app.py") if p != src])
    names: list[str] = []
    while len(names) < 3:
        name = _fn_name(rng, v)
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
    return normalize_text(block.lstrip("\n")) in normalize_text(text.lstrip("\n"))


def _run_command(rng: random.Random, v: dict[str, tuple]) -> Task:
    path = rng.choice(("calc.py", "count.py", "show.py", "main.py"))
    nums = [rng.randint(*v["nums"]) for _ in range(rng.randint(2, 4))]
    form = rng.randrange(3)
    if form == 0:
        code, output = f"print(sum({nums}))\n", str(sum(nums))
    elif form == 1:
        code, output = f"print({nums[0]} * {nums[1]})\n", str(nums[0] * nums[1])
    else:
        word = rng.choice(v["words"])
        code, output = f"print({word!r}.upper() + '-' + str({nums[0]} + {nums[-1]}))\n", \
            f"{word.upper()}-{nums[0] + nums[-1]}"
    files = {path: code}
    command = f"python3 {path}"
    prompt = f"Run `{command}` and tell me what it prints."
    unchanged = _unchanged(files)
    return _task(prompt, 1, files, [("bash", {"command": command})], f"It prints:\n```\n{output}\n```",
                 lambda ws, answer: unchanged(ws) and reports_output(answer, output))


_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.S)
_SPAN = re.compile(r"`([^`\n]+)`")


def reports_output(answer: str, output: str) -> bool:
    """Whether the answer quotes exactly `output` (up to normalize_text): in its fenced
    blocks where it has any, else in its inline code spans, else as a line of its own.
    Never a substring: "142" does not report "42", nor does a block "42\n43". An answer
    that does not set the output apart has not said what it is."""
    want = normalize_text(output)
    quoted = _FENCE.findall(answer) or _SPAN.findall(answer) or answer.split("\n")
    return any(normalize_text(q.strip("\n")) == want or normalize_text(q).strip() == want for q in quoted)


def _read_then_edit(rng: random.Random, v: dict[str, tuple]) -> Task:
    path = rng.choice(("settings.ini", "server.cfg", "app.ini", "env.cfg"))
    keys = rng.sample(("port", "host", "timeout", "retries", "workers", "cache", "debug", "region"), 4)
    sep = rng.choice((" = ", "=", ": "))
    values = {k: (str(rng.randint(*v["ints"])) if k in ("port", "timeout", "retries", "workers")
                  else rng.choice(v["words"])) for k in keys}
    lines = [f"{k}{sep}{values[k]}" for k in keys]
    i = rng.randrange(len(lines))
    key = keys[i]
    while True:
        value = str(rng.randint(*v["ints"])) if values[key].isdigit() else rng.choice(v["words"])
        if value != values[key]:
            break
    files = {path: _text_of(lines)}
    new_line = f"{key}{sep}{value}"
    expected = _text_of([new_line if j == i else line for j, line in enumerate(lines)])
    prompt = f"Set {key} to {value} in {path}."
    return _task(prompt, 2, files,
                 [("read_file", {"path": path}), ("edit_file", {"path": path, "old": lines[i], "new": new_line})],
                 f"Set {key} to {value} in {path}.", lambda ws, _a: _same_text(_read(ws, path), expected))


def _create_two_files(rng: random.Random, v: dict[str, tuple]) -> Task:
    first = _path(rng, v, ".txt")
    second = first
    while second == first:
        second = _path(rng, v, ".txt")
    a, b = _words(rng, rng.randint(2, 4), v), _words(rng, rng.randint(2, 4), v)
    prompt = f"Create two files: {first} containing `{a}` and {second} containing `{b}`."
    return _task(prompt, 2, {},
                 [("write_file", {"path": first, "content": a + "\n"}),
                  ("write_file", {"path": second, "content": b + "\n"})],
                 f"Created {first} and {second}.",
                 lambda ws, _a: _same_text(_read(ws, first), a) and _same_text(_read(ws, second), b))


_MAKERS: dict[str, Callable[[random.Random, dict[str, tuple]], Task]] = {
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


# --- long kinds -------------------------------------------------------------------------

# Each split's words for package, module and function names; the two share no word.
VOCAB: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "packages": ("shopkit", "cartlib", "ledgerly", "stockpy", "tillbox", "orderly", "pricepy", "vendkit"),
        "verbs": ("scale", "shift", "clamp", "round", "blend", "trim", "bump", "weigh"),
        "nouns": ("price", "order", "basket", "parcel", "coupon", "refund", "margin", "stock", "receipt",
                  "shelf", "bundle", "tariff"),
    },
    "heldout": {
        "packages": ("astrokit", "fieldlab", "sporely", "wavepy", "geolith", "tidebox", "orbitly", "fernkit"),
        "verbs": ("boost", "damp", "fold", "skew", "tilt", "pivot", "drift", "warp"),
        "nouns": ("voltage", "glyph", "orbit", "pollen", "quartz", "sonar", "comet", "lichen", "magma",
                  "nebula", "tremor", "plankton"),
    },
}
CHECK_TIMEOUT_S = 20.0
TEST_COMMAND = "python3 -m unittest discover -s tests"


def _distinct(rng: random.Random, make: Callable[[], str], n: int, avoid: tuple[str, ...] = ()) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = make()
        if name not in out and not any(name in a or a in name for a in (*avoid, *out)):
            out.append(name)
    return out


def _verb_noun(rng: random.Random, vocab: dict[str, tuple[str, ...]]) -> Callable[[], str]:
    return lambda: f"{rng.choice(vocab['verbs'])}_{rng.choice(vocab['nouns'])}"


def _arith(rng: random.Random) -> tuple[str, Callable[[int], int]]:
    """A body `return ...` of x and the function it computes."""
    k, c = rng.randint(2, 9), rng.randint(1, 20)
    form = rng.randrange(3)
    if form == 0:
        return f"x * {k} + {c}", lambda x: x * k + c
    if form == 1:
        return f"x - {c}", lambda x: x - c
    return f"(x + {c}) // {k}", lambda x: (x + c) // k


def _run_python(ws: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ws), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *argv], cwd=ws, env=env, capture_output=True, text=True,
                          timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)


def _add_feature(rng: random.Random, vocab: dict[str, tuple[str, ...]]) -> Task:
    pkg = rng.choice(vocab["packages"])
    mod = rng.choice(vocab["nouns"])
    names = _distinct(rng, _verb_noun(rng, vocab), rng.randint(3, 5), avoid=(pkg, mod))
    *old, new = names
    bodies = [_arith(rng) for _ in names]
    docs = {n: f"{n.split('_')[0].capitalize()} a {n.split('_')[1]} value." for n in names}

    def fn(name: str, body: str) -> str:
        return f'def {name}(x):\n    """{docs[name]}"""\n    return {body}\n'

    funcs = [fn(n, b) for n, (b, _) in zip(old, bodies)]
    new_fn = fn(new, bodies[-1][0])
    probe = rng.randint(2, 30)
    want = bodies[-1][1](probe)
    imports = ", ".join(old)
    registry = (f'"""Every operation of {pkg} by name."""\n\nfrom .{mod} import {imports}\n\nOPERATIONS = {{\n'
                + "".join(f'    "{n}": {n},\n' for n in old)
                + '}\n\n\ndef apply(name, x):\n    """Run the operation `name` on x."""\n    return OPERATIONS[name](x)\n')
    tests = (f"import unittest\n\nfrom {pkg}.{mod} import {imports}\n\n\nclass Test{mod.capitalize()}(unittest.TestCase):\n"
             + "\n".join(f"    def test_{n}(self):\n        self.assertEqual({n}({probe}), {b[1](probe)})\n"
                         for n, b in zip(old, bodies))
             + '\n\nif __name__ == "__main__":\n    unittest.main()\n')
    readme = (f"# {pkg}\n\nSmall helpers for {mod} values.\n\n## Operations\n\n"
              + "".join(f"- `{n}`: {docs[n]}\n" for n in old)
              + f"\n## Tests\n\n```\n{TEST_COMMAND}\n```\n")
    changelog = f"# Changelog\n\n## Unreleased\n\n- Added `{old[-1]}`.\n\n## 0.1.0\n\n- First release.\n"
    files = {"README.md": readme, "CHANGELOG.md": changelog, f"{pkg}/__init__.py": f'"""{pkg}."""\n',
             f"{pkg}/{mod}.py": "\n\n".join(funcs), f"{pkg}/registry.py": registry,
             f"tests/test_{mod}.py": tests}
    new_test = (f"import unittest\n\nfrom {pkg}.registry import apply\nfrom {pkg}.{mod} import {new}\n\n\n"
                f"class Test{''.join(w.capitalize() for w in new.split('_'))}(unittest.TestCase):\n"
                f"    def test_{new}(self):\n        self.assertEqual({new}({probe}), {want})\n\n"
                f"    def test_registered(self):\n        self.assertEqual(apply(\"{new}\", {probe}), {want})\n"
                '\n\nif __name__ == "__main__":\n    unittest.main()\n')
    last_doc = f"- `{old[-1]}`: {docs[old[-1]]}\n"
    body_text = bodies[-1][0]
    prompt = (f"In the {pkg} package, add a function `{new}(x)` to {pkg}/{mod}.py that returns `{body_text}` "
              f"(docstring: \"{docs[new]}\"). Register it in {pkg}/registry.py (import it and add it to "
              f"OPERATIONS), add a test file tests/test_{new}.py that checks {new}({probe}) == {want} directly "
              f"and through the registry, add `- Added `{new}`.` under Unreleased in CHANGELOG.md, list it "
              f"under Operations in README.md, then run the tests with `{TEST_COMMAND}` and tell me the result.")
    ideal = [
        ("bash", {"command": "find . -type f | sort"}),
        ("read_file", {"path": "README.md"}),
        ("read_file", {"path": f"{pkg}/{mod}.py"}),
        ("read_file", {"path": f"{pkg}/registry.py"}),
        ("read_file", {"path": f"tests/test_{mod}.py"}),
        ("read_file", {"path": "CHANGELOG.md"}),
        ("edit_file", {"path": f"{pkg}/{mod}.py", "old": funcs[-1], "new": f"{funcs[-1]}\n\n{new_fn}"}),
        ("edit_file", {"path": f"{pkg}/registry.py", "old": f"from .{mod} import {imports}\n",
                       "new": f"from .{mod} import {imports}, {new}\n"}),
        ("edit_file", {"path": f"{pkg}/registry.py", "old": f'    "{old[-1]}": {old[-1]},\n}}',
                       "new": f'    "{old[-1]}": {old[-1]},\n    "{new}": {new},\n}}'}),
        ("write_file", {"path": f"tests/test_{new}.py", "content": new_test}),
        ("edit_file", {"path": "CHANGELOG.md", "old": "## Unreleased\n\n",
                       "new": f"## Unreleased\n\n- Added `{new}`.\n"}),
        ("edit_file", {"path": "README.md", "old": last_doc, "new": f"{last_doc}- `{new}`: {docs[new]}\n"}),
        ("bash", {"command": TEST_COMMAND}),
        ("bash", {"command": f"python3 -c \"from {pkg}.registry import apply; print(apply('{new}', {probe}))\""}),
    ]
    n_tests = len(old) + 2
    answer = (f"Added `{new}` to {pkg}/{mod}.py, registered it in {pkg}/registry.py, added tests/test_{new}.py, "
              f"and noted it in CHANGELOG.md and README.md. `{TEST_COMMAND}` ran {n_tests} tests: OK, all pass.")
    expect = {n: [f(x) for x in (0, 1, probe, 97)] for n, (_, f) in zip(names, bodies)}
    script = (f"from {pkg}.registry import OPERATIONS\nfrom {pkg} import {mod}\n"
              f"want = {expect!r}\n"
              "for name, values in want.items():\n"
              "    assert [OPERATIONS[name](x) for x in (0, 1, %d, 97)] == values, name\n"
              "    assert getattr(%s, name) is OPERATIONS[name], name\n" % (probe, mod))

    def check(ws: Path, answer_text: str) -> bool:
        test = _read(ws, f"tests/test_{new}.py")
        log, readme_now = _read(ws, "CHANGELOG.md") or "", _read(ws, "README.md") or ""
        if test is None or new not in test or f"`{new}`" not in log.split("## 0.1.0")[0]:
            return False
        if f"`{new}`" not in readme_now or not all(_read(ws, p) is not None for p in files):
            return False
        if not (_keeps_lines(readme_now, readme) and _keeps_lines(log, changelog)):
            return False
        if _run_python(ws, ["-c", script]).returncode != 0:
            return False
        run = _run_python(ws, ["-m", "unittest", "discover", "-s", "tests"])
        ran = re.search(r"Ran (\d+) test", run.stderr)
        reported = re.search(r"\b(ok|pass|passed|passes)\b", answer_text.lower())
        return run.returncode == 0 and bool(ran) and int(ran.group(1)) >= n_tests and bool(reported)

    task = _task(prompt, len(ideal), files, ideal, answer, check)
    task.names = (pkg, mod, *names)
    return task


def _keeps_lines(text: str, original: str) -> bool:
    """Every non-blank line of `original` is still a line of `text`."""
    kept = {line.rstrip() for line in text.split("\n")}
    return all(line.rstrip() in kept for line in original.split("\n") if line.strip())


def _rename_symbol(rng: random.Random, vocab: dict[str, tuple[str, ...]]) -> Task:
    pkg = rng.choice(vocab["packages"])
    n_users = rng.randint(2, 6)
    mods = _distinct(rng, lambda: rng.choice(vocab["nouns"]), n_users + 1, avoid=(pkg,))
    core, users = mods[0], mods[1:]
    fnames = _distinct(rng, _verb_noun(rng, vocab), n_users + 3, avoid=(pkg, *mods))
    old, new, helper, user_fns = fnames[0], fnames[1], fnames[2], fnames[3:]
    body, _ = _arith(rng)
    files = {f"{pkg}/__init__.py": f'"""{pkg}."""\n',
             f"{pkg}/{core}.py": (f'def {old}(x):\n    """The {core} value of x."""\n    return {body}\n\n\n'
                                  f'def {helper}(x):\n    """Twice the {core} value."""\n    return {old}(x) * 2\n')}
    for mod, fn in zip(users, user_fns):
        k = rng.randint(1, 9)
        files[f"{pkg}/{mod}.py"] = (f"from .{core} import {old}\n\n\ndef {fn}(x):\n"
                                    f'    """The {mod} figure."""\n    return {old}(x) + {k}\n')
    main_imports = "".join(f"from {pkg}.{m} import {f}\n" for m, f in zip(users, user_fns))
    calls = ", ".join(f"{f}({i + 2})" for i, f in enumerate(user_fns))
    files["main.py"] = (f"from {pkg}.{core} import {old}, {helper}\n{main_imports}\n"
                        f"print({old}(1), {helper}(1))\nprint({calls})\n")
    word = re.compile(rf"\b{old}\b")
    expected = {rel: word.sub(new, text) for rel, text in files.items()}
    users_paths = [rel for rel, text in files.items() if word.search(text)]
    ideal: list[tuple[str, dict]] = [("bash", {"command": f"grep -rn {old} ."})]
    for rel in users_paths:
        ideal.append(("read_file", {"path": rel}))
        for line in files[rel].split("\n"):
            if word.search(line):
                ideal.append(("edit_file", {"path": rel, "old": line, "new": word.sub(new, line)}))
    ideal += [("bash", {"command": f"grep -rn {old} . || echo 'no {old} left'"}),
              ("bash", {"command": "python3 main.py"})]
    prompt = (f"Rename the function `{old}` to `{new}` everywhere in this project: its definition in "
              f"{pkg}/{core}.py and every import and call of it. Then check that no `{old}` remains and that "
              f"`python3 main.py` still runs.")
    answer = (f"Renamed `{old}` to `{new}` in {len(users_paths)} files ({', '.join(users_paths)}); grep finds "
              f"no `{old}` and `python3 main.py` runs.")

    def check(ws: Path, _a: str) -> bool:
        if not all(_same_text(_read(ws, rel), text) for rel, text in expected.items()):
            return False
        if any(word.search(p.read_text(errors="replace")) for p in ws.rglob("*.py") if p.is_file()):
            return False
        return _run_python(ws, ["main.py"]).returncode == 0

    task = _task(prompt, len(ideal), files, ideal, answer, check)
    task.names = (pkg, *mods, *fnames)
    return task


_LONG_MAKERS: dict[str, Callable[[random.Random, dict[str, tuple[str, ...]]], Task]] = {
    "add_feature": _add_feature,
    "rename_symbol": _rename_symbol,
}
assert set(_LONG_MAKERS) == set(LONG_KINDS)
