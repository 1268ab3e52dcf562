"""What a client cannot reach through the server: files outside the trace directory
(session ids are never paths), and Python modules the operator did not configure
(a request's jumpahead.policies names built-ins or the server's own user policies only)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jumpahead.traces.file_names import safe_file_stem

from .serving import serve

_STEM = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")
HOSTILE = st.one_of(st.text(max_size=300), st.sampled_from(
    ["..", ".", "../../etc/passwd", "/abs", "a/../../b", "\x00", "~root", "C:\\Windows", "..\\..\\x", ".hidden",
     "CON", "a" * 10_000, "é/日本", "\u202e", " ", ""]))


@settings(max_examples=300, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(session=HOSTILE)
def test_any_session_id_maps_to_a_plain_file_name_inside_the_dir(tmp_path_factory, session):
    from jumpahead.traces.recorder import TraceRecorder

    directory = tmp_path_factory.getbasetemp() / "traces-prop"
    recorder = TraceRecorder(directory)
    path = recorder.path_for(session)
    assert path.parent == recorder.directory and path.resolve().parent == recorder.directory
    assert path.name.endswith(".jsonl") and _STEM.match(path.name[:-6]), path.name
    assert len(path.name) <= 110


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(a=HOSTILE, b=HOSTILE)
def test_distinct_session_ids_get_distinct_files(a, b):
    if a != b:
        assert safe_file_stem(a or "unknown") != safe_file_stem(b or "unknown")


def test_traces_import_out_keeps_hostile_session_ids_inside(tmp_path, loaded_model):
    """`jumpahead traces import --out DIR` names files by session ids read from the
    imported files (anyone's): they stay in DIR, and a symlink planted there is not followed."""
    from jumpahead.traces.recorder import TraceRecorder

    src = tmp_path / "src"
    recorder = TraceRecorder(src, model="m")
    hostile = "../../../escaped"
    with open(recorder.path_for(hostile), "wb") as fh:  # a jumpahead trace file claiming that session id
        fh.write(b'{"type": "session", "format": "jumpahead-trace", "version": 1, "session": "../../../escaped"}\n')
        fh.write(b'{"type": "turn", "index": 0, "session": "../../../escaped", "context": {"messages": '
                 b'[{"role": "user", "content": "hi"}]}, "response": {"content": "hello"}}\n')
    out = tmp_path / "deep" / "out"
    out.mkdir(parents=True)
    outside = tmp_path / "outside.json"
    (out / f"{safe_file_stem(hostile)}.json").symlink_to(outside)  # planted by another local user
    proc = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "traces", "import",
                           str(recorder.path_for(hostile)), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    files = sorted(p for p in tmp_path.rglob("*.json") if not p.is_symlink())
    assert len(files) == 1 and files[0].parent == out, files
    assert not outside.exists(), "the planted symlink was followed"
    assert not (tmp_path / "escaped.json").exists() and not (tmp_path.parent / "escaped.json").exists()


# --- policies named by requests --------------------------------------------------------------

PROBE_MODULE = "jumpahead_probe_policy_mod"
FINE_MODULE = "jumpahead_fine_policy_mod"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Two importable modules: one the operator configured, one a request could name
    (importing it leaves a marker file: it must never be imported)."""
    root = tmp_path_factory.mktemp("policy-modules")
    marker = root / "IMPORTED"
    (root / f"{PROBE_MODULE}.py").write_text(textwrap.dedent(f"""
        open({str(marker)!r}, "w").write("imported by a request")
        class Evil:
            def on_request(self, ctx):
                return None
    """))
    (root / f"{FINE_MODULE}.py").write_text(textwrap.dedent("""
        class Fine:
            calls = 0
            def __init__(self, **options):
                self.options = options
            def on_request(self, ctx):
                Fine.calls += 1
                return None
    """))
    sys.path.insert(0, str(root))
    yield marker
    sys.path.remove(str(root))
    sys.modules.pop(FINE_MODULE, None)


@pytest.fixture(scope="module")
def policy_server(engine, planted):
    from jumpahead.policies.runtime import PolicyHooks

    hooks = [PolicyHooks([f"{FINE_MODULE}:Fine"], engine.tokenizer, engine.context_length)]
    hooks[0].check()
    with serve(engine, hooks=hooks) as url:
        yield url


def _bodies(policies):
    jp = {"policies": policies}
    return {
        "/v1/chat/completions": {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                                 "jumpahead": jp},
        "/v1/messages": {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                         "jumpahead": jp},
        "/v1/responses": {"model": "m", "max_output_tokens": 1, "input": "hi", "jumpahead": jp},
    }


def test_requests_cannot_load_modules_the_operator_did_not_configure(policy_server, planted):
    refused = [[f"{PROBE_MODULE}:Evil"], [{"name": f"{PROBE_MODULE}:Evil"}], f"{PROBE_MODULE}:Evil:x=1",
               ["os:system"], ["subprocess:Popen"], ["masking", f"{PROBE_MODULE}:Evil"],
               [f"{FINE_MODULE}:Other"], ["builtins:eval"]]
    with httpx.Client(base_url=policy_server, timeout=120) as c:
        for policies in refused:
            for path, body in _bodies(policies).items():
                r = c.post(path, json=body)
                assert r.status_code == 400, (policies, r.text[:300])
                text = r.text
                assert "not enabled on this server" in text, text[:300]
        assert not planted.exists(), "a request made the server import a module"
        assert PROBE_MODULE not in sys.modules


def test_requests_may_name_builtins_and_configured_policies(policy_server):
    import jumpahead_fine_policy_mod as fine  # the operator's module, imported at startup

    before = fine.Fine.calls
    with httpx.Client(base_url=policy_server, timeout=120) as c:
        for policies in (["masking"], [{"name": f"{FINE_MODULE}:Fine", "level": 2}]):
            for path, body in _bodies(policies).items():
                r = c.post(path, json=body)
                assert r.status_code == 200, (policies, path, r.text[:300])
    assert fine.Fine.calls >= before + 6  # the configured policy ran (3 server-wide + 3 named)
