"""Real agent clients end to end against the server in script mode.

Each client is installed into a scratch cache (tests/agent_clients.py), pointed at a
server whose script makes the agent create hello.txt through its own tool and then
finish, and run with a scratch HOME. The test checks the file on disk and that the
client consumed exactly the scripted turns. The default model is too small to act;
the script supplies its answers, which still run through the real model, the real
output parser and the real wire protocols (docs/design.md, Protocols; CLIENTS.md).

Claude Code, pi (openai-completions, anthropic-messages, openai-responses) and
mini-swe-agent run against an in-process server; aider runs against a real
`jumpahead serve --script` subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.core.script import Script, ScriptedCall, ScriptTurn

from . import agent_clients
from .serving import cli_process, free_port, interrupt, script_engine, serve, wait_health

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

TASK = "create hello.txt containing hello world"
CONTENT = "hello world\n"
PROMPT_LIMIT = 512  # script mode: client prompts (Claude Code's is ~20k tokens) are cut before prefill
CLIENT_TIMEOUT_S = 600
CLIENT_ENV_PREFIXES = ("ANTHROPIC_", "OPENAI_", "CLAUDE", "PI_", "LITELLM_", "MSWEA_", "AIDER_")


@pytest.fixture(scope="module")
def engine(loaded_model):
    eng = script_engine(loaded_model, max_batch=2)
    yield eng
    eng.close()


def _client(kind: str, name: str) -> Path:
    try:
        return agent_clients.npm_client(name) if kind == "npm" else agent_clients.python_client(name)
    except agent_clients.InstallError as exc:
        if "not on PATH" in str(exc):
            pytest.skip(str(exc))
        pytest.fail(str(exc))


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLIENT_ENV_PREFIXES)}
    env.update(HOME=str(home), NO_COLOR="1", **extra)
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=CLIENT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work, work / "hello.txt"


def test_claude_code(engine, tmp_path):
    claude = _client("npm", "claude")
    home, work, target = _dirs(tmp_path)
    script = Script([
        ScriptTurn(reasoning="The user wants a new file; the Write tool creates it.",
                   tool_calls=[ScriptedCall("Write", {"file_path": str(target), "content": CONTENT})]),
        ScriptTurn(text="Created hello.txt."),
    ], prompt_limit=PROMPT_LIMIT)
    with serve(engine, script=script) as url:
        env = _env(home, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="dummy", ANTHROPIC_MODEL="my-local-model",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
        done = _run([claude, "-p", TASK, "--permission-mode", "acceptEdits", "--output-format", "json"], work, env)
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["result"] == "Created hello.txt."
    assert target.read_text() == CONTENT
    assert script.served == 2


def test_claude_code_three_turns_hit_the_prefix_cache(tmp_path):
    """`jumpahead bench claude-code`: a real `claude -p` 3-turn scripted task (Write, Bash,
    text) against `jumpahead serve --script` with the context-sized prompt limit (Claude
    Code's ~20k-token prompt is fitted to the 8k window), a cold prefix cache: turn 1
    prefills, turns 2 and 3 find nearly all of their prompt cached (the server's trace)."""
    from jumpahead.bench.claude_code import main

    claude = _client("npm", "claude")
    out = tmp_path / "result.json"
    assert main(["--claude", str(claude), "--out", str(out)]) == 0, out.read_text() if out.exists() else ""
    result = json.loads(out.read_text())
    turns = result["turns"]
    assert result["ok"] and len(turns) == 3 and turns[0]["cached_tokens"] == 0
    assert turns[0]["prompt_tokens"] > 4096, "Claude Code's prompt was fitted to the window, not dropped"
    for before, turn in zip(turns, turns[1:]):
        assert turn["cached_tokens"] >= before["prompt_tokens"] and turn["cached_share"] > 0.9, turns


PI_PROVIDERS = {
    "local-oai": {"api": "openai-completions", "path": "/v1", "reasoning": False},
    "local-anth": {"api": "anthropic-messages", "path": "", "reasoning": True},
    "local-resp": {"api": "openai-responses", "path": "/v1", "reasoning": True},
}


@pytest.mark.parametrize("provider", list(PI_PROVIDERS))
def test_pi(engine, tmp_path, provider):
    pi = _client("npm", "pi")
    home, work, target = _dirs(tmp_path)
    spec = PI_PROVIDERS[provider]
    first = ScriptTurn(tool_calls=[ScriptedCall("write", {"path": str(target), "content": CONTENT})])
    if spec["reasoning"]:
        first.reasoning = "The write tool creates the file."
    script = Script([first, ScriptTurn(text="Created hello.txt.")], prompt_limit=PROMPT_LIMIT)
    with serve(engine, script=script) as url:
        model = {"id": "local", "contextWindow": 128000, "maxTokens": 8192, "reasoning": spec["reasoning"]}
        config = {"providers": {provider: {"baseUrl": url + spec["path"], "api": spec["api"], "apiKey": "dummy",
                                           "models": [model]}}}
        (home / ".pi" / "agent").mkdir(parents=True)
        (home / ".pi" / "agent" / "models.json").write_text(json.dumps(config))
        done = _run([pi, "-p", "--provider", provider, "--model", "local", TASK], work, _env(home, PI_OFFLINE="1"))
    assert "Created hello.txt." in done.stdout
    assert target.read_text() == CONTENT
    assert script.served == 2


def test_mini_swe_agent(engine, tmp_path):
    mini = _client("python", "mini")
    home, work, target = _dirs(tmp_path)
    script = Script([
        ScriptTurn(text="I will create the file.",
                   tool_calls=[ScriptedCall("bash", {"command": f"echo 'hello world' > {target}"})]),
        ScriptTurn(tool_calls=[ScriptedCall("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]),
    ], prompt_limit=PROMPT_LIMIT)
    with serve(engine, script=script) as url:
        env = _env(home, MSWEA_CONFIGURED="true", MSWEA_COST_TRACKING="ignore_errors",
                   LITELLM_LOCAL_MODEL_COST_MAP="True")
        _run([mini, "-m", "openai/local", "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={url}/v1",
              "-c", "model.model_kwargs.api_key=dummy", "-t", TASK, "--yolo", "--exit-immediately"], work, env)
    trajectory = json.loads((home / ".config" / "mini-swe-agent" / "last_mini_run.traj.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"
    assert target.read_text() == CONTENT
    assert script.served == 2


def test_aider_against_serve_script_subprocess(tmp_path):
    aider = _client("python", "aider")
    home, work, target = _dirs(tmp_path)
    script_file = tmp_path / "script.jsonl"
    script_file.write_text(json.dumps({"text": "hello.txt\n```\nhello world\n```\n"}) + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = cli_process(["serve", "--port", str(port), "--max-batch", "1", "--script", str(script_file),
                          "--script-prompt-limit", str(PROMPT_LIMIT), "--log-level", "warning"])
    try:
        wait_health(server, url, timeout=300, ok=True, poll=0.5)
        env = _env(home, LITELLM_LOCAL_MODEL_COST_MAP="True")
        _run([aider, "--model", "openai/local", "--openai-api-base", f"{url}/v1", "--openai-api-key", "dummy",
              "--yes-always", "--no-git", "--no-pretty", "--no-check-update", "--analytics-disable",
              "--no-show-model-warnings", "--edit-format", "whole", "--message", TASK], work, env)
        assert target.read_text() == CONTENT
        assert httpx.get(f"{url}/health").json()["script"] == {"file": str(script_file), "turns": 1, "served": 1}
    finally:
        code = interrupt(server, timeout=60)
    assert code == 0
