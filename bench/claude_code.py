"""`jumpahead bench claude-code`: a real Claude Code (`claude -p`) runs a 3-turn scripted
task against `jumpahead serve --script` on the default model, and the server's own trace
says, per turn, how much of the prompt was a prefix-cache hit and how long the first
token took. Claude Code's prompt (~20k tokens of system prompt and tool schemas) does not
fit the default model's 8k window; script mode fits it (core/script.py `fit_prompt`) so
that a later turn extends the earlier fitted prompt. Turn 1 is the cold baseline the
later turns are compared against, side by side in the same run.

The script: Write hello.txt, then Bash `cat hello.txt`, then a closing text. The file on
disk and the number of turns served are checked; a run that fails says so (exit 1)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

TASK = "create hello.txt containing hello world, then show it with cat"
CONTENT = "hello world\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _find_claude(given: str | None) -> str:
    for candidate in (given, shutil.which("claude"),
                      str(Path.home() / ".cache/jumpahead/clients/npm/node_modules/.bin/claude")):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("jumpahead bench claude-code: no `claude` found: pass --claude PATH "
                     "(npm install @anthropic-ai/claude-code, or python tests/agent_clients.py)")


def _turns(trace_dir: Path) -> list[dict[str, Any]]:
    records = []
    for f in sorted(trace_dir.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if "usage" in rec and "timings" in rec:
                records.append(rec)
    records.sort(key=lambda r: r.get("started") or r.get("time") or 0)
    out = []
    for r in records:
        u, t = r["usage"], r["timings"]
        first = t["round_ms"][0][0] / 1000 if t.get("round_ms") else None
        out.append({"prompt_tokens": u["prompt_tokens"], "cached_tokens": u["cached_tokens"],
                    "cached_share": round(u["cached_tokens"] / max(1, u["prompt_tokens"]), 3),
                    "prefill_s": t["prefill_s"], "ttft_s": first, "total_s": t["total_s"]})
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="jumpahead bench claude-code", description=__doc__.splitlines()[0])
    parser.add_argument("--claude", default=None, help="the claude executable (default: on PATH, or the test cache's)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the whole client run (default 1800)")
    parser.add_argument("--out", default=None, help="also write the JSON result here")
    args = parser.parse_args(argv)
    claude = _find_claude(args.claude)
    with tempfile.TemporaryDirectory(prefix="jumpahead-claude-") as tmp:
        root = Path(tmp)
        home, work, traces = root / "home", root / "work", root / "traces"
        for d in (home, work, traces):
            d.mkdir()
        target = work / "hello.txt"
        script = root / "script.jsonl"
        script.write_text("\n".join(json.dumps(t) for t in [
            {"reasoning": "The user wants a new file; the Write tool creates it.",
             "tool_calls": [{"name": "Write", "arguments": {"file_path": str(target), "content": CONTENT}}]},
            {"tool_calls": [{"name": "Bash", "arguments": {"command": "cat hello.txt", "description": "Show hello.txt"}}]},
            {"text": "Created hello.txt; it contains hello world."},
        ]) + "\n")
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "jumpahead.app.cli", "serve", "--script", str(script),
                                   "--trace-dir", str(traces), "--port", str(port), "--log-level", "warning",
                                   "--prefix-cache-dir", str(root / "prefix-cache")],  # cold: no earlier run's entries
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 600
            while True:
                if server.poll() is not None:
                    raise SystemExit(f"the server exited {server.returncode}: {server.stderr.read()[-2000:]}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not come up in 600 s")
                time.sleep(0.5)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE"))}
            env.update(HOME=str(home), NO_COLOR="1", ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="dummy",
                       ANTHROPIC_MODEL="my-local-model", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                       DISABLE_AUTOUPDATER="1")
            started = time.perf_counter()
            done = subprocess.run([claude, "-p", TASK, "--permission-mode", "acceptEdits", "--allowedTools", "Bash",
                                   "--output-format", "json"], cwd=work, env=env, capture_output=True, text=True,
                                  timeout=args.timeout, stdin=subprocess.DEVNULL)
            wall = time.perf_counter() - started
            served = httpx.get(f"{url}/health", timeout=5).json().get("script", {}).get("served")
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        turns = _turns(traces)
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            answer = {"raw": done.stdout[-2000:], "stderr": done.stderr[-2000:]}
        ok = (done.returncode == 0 and target.exists() and target.read_text() == CONTENT and served == 3
              and len(turns) == 3)
        result: dict[str, Any] = {"ok": ok, "client_rc": done.returncode, "client_wall_s": round(wall, 1),
                                  "turns_served": served, "file_written": target.exists(),
                                  "result": answer.get("result"), "turns": turns}
        if len(turns) >= 2 and turns[0]["ttft_s"]:
            result["ttft_vs_turn1"] = [round(t["ttft_s"] / turns[0]["ttft_s"], 3) for t in turns[1:]]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if ok else 1
