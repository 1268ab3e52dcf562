"""Copy-opportunity analysis: constructed sessions with answers worked out here, then
the public sessions (where the importers and ../shared exist)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jumpahead.traces import analysis as A
from jumpahead.core.turn import Message, ToolCall
from jumpahead.traces.session import Session

SHARED = Path(os.environ.get("JUMPAHEAD_SHARED", Path(__file__).resolve().parents[2] / "shared"))

# A file body long enough for many 8-token windows; lines start with letters so a
# line's tokens do not depend on what precedes the newline.
FILE = "\n".join(
    f"def handler_{i}(request, session):\n    return render(request, 'page_{i}.html', {{'user': session.user}})"
    for i in range(12)
)
SHORT_LINES = "\n".join(f"v{i} = {i}" for i in range(40))  # each line shorter than a window


@pytest.fixture(scope="module")
def tok():
    return A.load_tokenizer()


def n_tokens(tok, text: str) -> int:
    return len(A.batch_encoder(tok)([text])[0])


def msg(role, content="", reasoning="", calls=()):
    return Message(role=role, content=content, reasoning=reasoning, tool_calls=list(calls))


def write(content: str, path: str = "app/views.py") -> ToolCall:
    return ToolCall(name="write", arguments={"path": path, "content": content})


def test_argument_values_are_what_the_model_types():
    c = ToolCall("edit", {"path": "a.py", "edits": [{"old": "x", "new": "y"}], "n": 3, "flag": None})
    assert A.argument_values(c) == ["a.py", "x", "y", "3"]
    assert A.argument_values(ToolCall("bash", '{"command": "ls -la"}')) == ["ls -la"]
    assert A.argument_values(ToolCall("bash", "ls -la | head")) == ["ls -la | head"]  # raw text
    assert A.argument_values(ToolCall("noop", {})) == []


def test_write_of_read_content_is_context_copyable_not_reasoning(tok):
    s = Session("w", "test", [
        msg("system", "You are a coding agent."),
        msg("user", "Copy the views to app/views.py"),
        msg("assistant", reasoning="I should read the old file first.",
            calls=[ToolCall("read", {"path": "old/views.py"})]),
        msg("tool", FILE),
        msg("assistant", reasoning="Now I write it to the new place.", calls=[write(FILE)]),
    ])
    r = A.analyze_session(s, tok)
    row = r["calls"][1]
    n_file, n_path = n_tokens(tok, FILE), n_tokens(tok, "app/views.py")
    assert row["tokens"] == n_file + n_path  # values only: no keys, no JSON syntax
    # the whole file body is an exact earlier segment; the 4-token path is too short for a window
    assert row["from_context"] == n_file and row["copyable"] == n_file
    assert row["from_reasoning_text"] == 0 and row["from_reasoning"] == 0
    assert row["longest_span"] == n_file
    assert r["copyable"]["tool_results"] == n_file and r["copyable"]["calls"] == 0
    assert r["copyable"]["user"] == 0 and r["copyable"]["system"] == 0
    assert r["shares"]["context"] == pytest.approx(n_file / r["tokens"]["calls"])
    assert r["shares"]["reasoning_text"] == 0.0
    # gen-to-gen: nothing the assistant wrote before repeats
    assert r["gen_to_gen"]["tokens"] == 0


def test_content_first_stated_in_reasoning_is_reasoning_copyable(tok):
    enc = A.batch_encoder(tok)
    reasoning = "The fixed file should read:\n" + FILE
    ids_r, ids_f = enc([reasoning])[0], enc([FILE])[0]
    # precondition: the file's tokens appear unchanged inside the reasoning's tokens
    assert any(ids_r[i:i + len(ids_f)] == ids_f for i in range(len(ids_r)))
    s = Session("r", "test", [
        msg("user", "Write the views."),
        msg("assistant", reasoning=reasoning, calls=[write(FILE)]),  # same message: reasoning precedes the call
    ])
    r = A.analyze_session(s, tok)
    n_file = len(ids_f)
    assert r["copyable"]["reasoning"] == n_file and r["copyable"]["reasoning_text"] == n_file
    assert r["copyable"]["context"] == 0 and r["copyable"]["tool_results"] == 0
    # and stated in visible text (not hidden reasoning): (a) counts it, (a') does not
    s2 = Session("t", "test", [msg("user", "Write the views."),
                               msg("assistant", content=reasoning),
                               msg("assistant", calls=[write(FILE)])])
    r2 = A.analyze_session(s2, tok)
    assert r2["copyable"]["reasoning_text"] == n_file and r2["copyable"]["reasoning"] == 0


def test_only_earlier_material_counts_and_a_call_is_never_its_own_source(tok):
    body = FILE + "\n" + FILE  # repeats itself inside one call
    s = Session("o", "test", [
        msg("user", "go"),
        msg("assistant", calls=[write(body)]),
        msg("tool", body),  # the result comes after the call: not a source for it
        msg("assistant", reasoning=body),  # later reasoning: not a source either
        msg("assistant", calls=[write(body, "b.py")]),  # now every window was seen earlier
    ])
    r = A.analyze_session(s, tok)
    first, second = r["calls"]
    assert first["copyable"] == 0 and first["longest_span"] == 0
    n_body = n_tokens(tok, body)
    assert second["copyable"] == n_body
    assert r["copyable"]["calls"] == n_body
    # gen-to-gen: message 1 is new; message 3 (reasoning) repeats message 1's call, message 4 repeats both
    n_b = n_tokens(tok, "b.py")
    assert r["gen_to_gen"]["tokens"] == n_body + n_body
    assert r["tokens"]["output"] == 3 * n_body + n_tokens(tok, "app/views.py") + n_b
    assert r["gen_to_gen"]["share"] == pytest.approx(2 * n_body / r["tokens"]["output"])


def test_sibling_calls_count_and_tool_definitions_are_system(tok):
    s = Session("s", "test", [
        msg("user", "go"),
        msg("assistant", calls=[write(FILE, "a.py"), write(FILE, "b.py")]),
    ], tools=[{"type": "function", "function": {"name": "write", "description": FILE}}])
    r = A.analyze_session(s, tok)
    a, b = r["calls"]
    n_file = n_tokens(tok, FILE)
    assert b["copyable"] == n_file  # from the sibling call a, earlier in the same message
    assert r["copyable"]["calls"] == n_file  # only b: a is never its own source
    # a's source is the tool description, which sits in a JSON text (newlines escaped),
    # so only the windows inside one line match
    assert 0 < a["copyable"] == a["from_context"] < n_file
    assert a["from_reasoning_text"] == 0


def test_line_number_prefixes_are_stripped_from_tool_results(tok):
    numbered = "\n".join(f"{i + 1:>6}→{line}" for i, line in enumerate(SHORT_LINES.split("\n")))
    assert A.strip_line_numbers(numbered) == SHORT_LINES
    s = Session("n", "test", [
        msg("user", "edit it"),
        msg("assistant", calls=[ToolCall("Read", {"file_path": "/x.py"})]),
        msg("tool", numbered),
        msg("assistant", calls=[ToolCall("Edit", {"old_string": SHORT_LINES, "new_string": "v = 0"})]),
    ])
    r = A.analyze_session(s, tok)
    n = n_tokens(tok, SHORT_LINES)
    # every line is shorter than a window, so the numbered text shares no 8-token window
    assert r["copyable"]["tool_results"] == 0 and r["copyable"]["context"] == 0
    assert r["copyable"]["tool_results_stripped"] == n and r["copyable"]["context_stripped"] == n
    assert r["calls"][1]["from_context"] == n  # per-call rows report the stripped measure


def test_shares_and_table(tok):
    s = Session("table-session", "test", [msg("user", FILE), msg("assistant", calls=[write(FILE)])])
    r = A.analyze_session(s, tok)
    result = {"window": A.W, "sessions": [r], "overall": A.combine([r])}
    assert result["overall"]["shares"] == r["shares"]
    assert result["overall"]["by_tool"]["write"]["calls"] == 1
    table = A.format_table(result)
    assert "table-session" in table and "overall" in table and "write" in table
    assert f"{100 * r['shares']['user']:.1f}%" in table


def _importers_ready() -> bool:
    try:
        from jumpahead.traces.formats import known_formats

        return bool(known_formats())
    except ImportError:
        return False


def test_public_sessions():
    public = SHARED / "traces" / "public"
    if not public.is_dir():
        pytest.skip(f"{public} is absent: the public sessions live in ../shared")
    if not _importers_ready():
        pytest.skip("the trace importers (traces/importers) are not there yet")
    files = sorted(str(p) for p in public.rglob("*") if p.is_file() and p.name != "SOURCES.md")
    t0 = time.perf_counter()
    result = A.analyze_paths(files)
    elapsed = time.perf_counter() - t0
    assert elapsed < 60, f"analysis took {elapsed:.1f}s"
    assert result["kind"] == "jumpahead.analysis" and result["version"] == 1
    assert len(result["sessions"]) >= len(files)
    for s in result["sessions"] + [result["overall"]]:
        for v in list(s["shares"].values()) + [s["gen_to_gen"]["share"], s["calls_share_of_output"]]:
            assert 0.0 <= v <= 1.0
        # the union measures bound their parts
        sh = s["shares"]
        assert sh["reasoning"] <= sh["reasoning_text"] <= sh["any"]
        assert sh["tool_results"] <= sh["context"] <= sh["context_stripped"] <= sh["any"]
    overall = result["overall"]
    assert overall["tokens"]["calls"] > 10_000
    # docs/design.md: copying from the context is the large lever, reasoning the small one
    assert overall["shares"]["context_stripped"] > overall["shares"]["reasoning_text"]
    assert overall["shares"]["context_stripped"] > 0.3
    rows = [c for s in result["sessions"] for c in s["calls"]]
    assert all(0 <= c["longest_span"] <= c["copyable"] <= c["tokens"] for c in rows)
    print(A.format_table(result))
