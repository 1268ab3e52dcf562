"""`jumpahead serve --script`: a bad script file is refused before the model loads."""

from __future__ import annotations

import subprocess
import sys


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "serve", *args],
                          capture_output=True, text=True, timeout=120)


def test_missing_and_malformed_scripts_exit_2(tmp_path):
    out = _serve("--script", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 2 and "cannot read script" in out.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "typo"}\n')
    out = _serve("--script", str(bad))
    assert out.returncode == 2 and "line 2: unknown keys ['txt']" in out.stderr


def test_help_lists_script_options():
    out = _serve("--help")
    assert out.returncode == 0 and "--script FILE" in out.stdout and "--script-prompt-limit N" in out.stdout
