"""`jumpahead bench cache`: time to first token of an agent's next turn, side by side:
no cache (cold) vs a RAM hit vs an SSD hit after a restart.

A real recorded session (mini-swe-agent, OpenAI-style messages, from
../shared/traces/public/) is rendered with the model's chat template up to ~N tokens
of context (turn A, ending in a tool result). The model answers turn A; turn B is the
conversation plus the model's answer plus the next recorded tool result, which is what
an agent sends next. Arms (the SSD arm last, after this process has let go of its
model, as the old server is gone when one restarts):

- cold: an engine with the prefix cache off runs turn B;
- ram:  an engine with the cache on runs turn A, then turn B (hit from RAM);
- ssd:  a restart: a new process loads the model and starts an engine over a copy of
        the cache directory as it was after turn A (its files dropped from the OS page
        cache with posix_fadvise, so they are read from the device), and runs turn B
        (hit from SSD); the child reports its time to first token (after its engine
        started: `startup_s`) and its tokens. `--restarts N` (default 3) restarts, each
        over a fresh copy; the median is the figure and every sample is listed.

Every arm's tokens are compared with the cold arm's, each run; a difference fails
the command (exit 1).

It also measures the effect of a per-request value at the top of a prompt (Claude
Code's `x-anthropic-billing-header` system line) on reuse, from the captured client
requests in ../shared/fixtures/clients/claude-code/: how many tokens of the rendered
prompt two requests share when only that line differs (= the cached tokens a hit can
reuse, since a hit is the longest common prefix).

    python -m jumpahead.bench.cache [--context 4096] [--gen 16]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from jumpahead.engine.interface import Engine

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACE = SHARED / "traces/public/mini-swe-agent/marshmallow-code__marshmallow-1343.traj.json"
CLAUDE_CODE = SHARED / "fixtures/clients/claude-code"


# --- the session -------------------------------------------------------------------------


def openai_messages(path: Path) -> list[dict[str, Any]]:
    """A mini-swe-agent trajectory's messages as chat-template input (tool calls parsed)."""
    data = json.loads(path.read_text())
    out = []
    for m in data["messages"]:
        role = m["role"]
        content = m.get("content")
        content = content if isinstance(content, str) else ("" if content is None else str(content))
        if role == "assistant":
            raw = m.get("tool_calls")
            calls = ast.literal_eval(raw) if isinstance(raw, str) and raw not in ("", "None") else (raw or [])
            out.append({
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {"type": "function", "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                    for c in calls
                ],
            })
        else:
            out.append({"role": role, "content": content})
    return out


def render(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def pick_turn(tokenizer: Any, messages: list[dict[str, Any]], context: int) -> int:
    """The largest k such that messages[:k] ends in a tool/user message, renders to at
    most `context` tokens, and is followed by a recorded assistant turn and its result."""
    best = 0
    for k in range(2, len(messages) - 1):
        if messages[k - 1]["role"] not in ("tool", "user") or messages[k]["role"] != "assistant":
            continue
        if messages[k + 1]["role"] not in ("tool", "user"):
            continue
        if len(render(tokenizer, messages[:k])) > context:
            break
        best = k
    if not best:
        raise ValueError("no turn of the session fits the requested context")
    return best


# --- timing ------------------------------------------------------------------------------


def timed(engine: "Engine", prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """Run one request; time to its first chunk, its tokens and cached prompt tokens."""
    from jumpahead.engine.types import GenerationRequest

    async def go() -> dict[str, Any]:
        t0 = time.perf_counter()
        ttft = None
        tokens: list[int] = []
        cached = 0
        async for chunk in engine.stream(GenerationRequest(prompt=prompt, max_tokens=max_tokens)):
            if ttft is None:
                ttft = time.perf_counter() - t0
                cached = chunk.cached_tokens
            tokens += chunk.tokens
        return {"ttft_s": round(ttft, 4), "cached_tokens": cached, "tokens": tokens,
                "total_s": round(time.perf_counter() - t0, 3)}

    return asyncio.run(go())


def mlx_lm_timed(model: Any, tokenizer: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """mlx-lm `stream_generate` from an empty cache: time to its first token, its tokens."""
    from mlx_lm import stream_generate

    t0 = time.perf_counter()
    ttft = None
    tokens: list[int] = []
    for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        if ttft is None:
            ttft = time.perf_counter() - t0
        tokens.append(r.token)
    return {"ttft_s": round(ttft, 4), "tokens": tokens}


def drop_page_cache(directory: Path) -> bool:
    """Ask the kernel to forget the cached pages of every file (so reads hit the device)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for p in directory.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return True


def restarted(model: str | None, cache_dir: Path, prompt: list[int], max_tokens: int, work: Path) -> dict[str, Any]:
    """Turn `prompt` in a new process (`--ssd-child`): load the model, open the cache
    directory, run the request. Its time to first token excludes the model load."""
    import subprocess

    request = work / "ssd-child.json"
    request.write_text(json.dumps({"model": model, "cache_dir": str(cache_dir), "prompt": prompt,
                                   "max_tokens": max_tokens}))
    done = subprocess.run([sys.executable, "-m", "jumpahead.bench.cache", "--ssd-child", str(request)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the restarted process failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ssd_child(request_file: str) -> int:
    """The restarted process of the SSD arm: prints one JSON line."""
    import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    req = json.loads(Path(request_file).read_text())
    m, tok, info = load_model(req["model"], progress=lambda s: None)
    t0 = time.perf_counter()
    eng = Engine(m, tok, info, EngineConfig(prefix_cache_dir=req["cache_dir"]))
    index_s = time.perf_counter() - t0
    try:
        out = timed(eng, req["prompt"], req["max_tokens"])
        out.update(index_s=index_s, prefix_cache=eng.metrics()["prefix_cache"], pid=os.getpid())
    finally:
        eng.close()
    print(json.dumps(out))
    return 0


# --- billing header ----------------------------------------------------------------------


def billing_header_effect(tokenizer: Any, fixtures: Path = CLAUDE_CODE) -> dict[str, Any]:
    """Tokens two Claude Code requests share when only the billing line differs."""
    path = fixtures / "001_POST_v1_messages.json"
    body = json.loads(path.read_text())["body"]
    blocks = [b["text"] for b in body["system"]]
    header_i = next(i for i, t in enumerate(blocks) if t.startswith("x-anthropic-billing-header:"))
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t.get("input_schema", {})}} for t in body.get("tools", [])]

    def rendered(header: str | None) -> list[int]:
        parts = list(blocks)
        if header is None:
            del parts[header_i]
        else:
            parts[header_i] = header
        msgs = [{"role": "system", "content": [{"type": "text", "text": t} for t in parts]}] + body["messages"]
        ids = tokenizer.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=True)
        return [int(i) for i in (ids["input_ids"] if hasattr(ids, "input_ids") else ids)]

    def lcp(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    original = blocks[header_i]
    variants = {
        "same_header": original,
        "fingerprint_changed": original.replace("cc_version=2.1.197.2bb", "cc_version=2.1.197.7f3"),
        "per_request_cch_added": original.rstrip(";") + "; cch=5a1e0;",
    }
    base = rendered(original)
    out: dict[str, Any] = {"fixture": str(path), "header_line": original, "prompt_tokens": len(base), "variants": {}}
    for name, text in variants.items():
        other = rendered(text)
        out["variants"][name] = {"header_line": text, "shared_prefix_tokens": lcp(base, other),
                                 "reusable_fraction": round(lcp(base, other) / len(base), 4)}
    stripped_a, stripped_b = rendered(None), rendered(None)
    out["header_stripped_by_proxy"] = {"prompt_tokens": len(stripped_a), "shared_prefix_tokens": lcp(stripped_a, stripped_b)}
    return out


# --- the bench ---------------------------------------------------------------------------


def run(
    model: str | None = None,
    context: int = 4096,
    gen_tokens: int = 16,
    trace: str | None = None,
    work_dir: str | None = None,
    mlx_lm: bool = False,
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    ssd_restarts: int = 3,
) -> dict[str, Any]:
    """Run the bench; returns (and the CLI prints) a JSON-able dict."""
    trace_path = Path(trace) if trace else TRACE
    if not trace_path.exists():
        msg = f"skipped: {trace_path} is absent (the bench replays a session from ../shared/traces/public)"
        progress(msg)
        return {"skipped": msg}

    import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

    m, tok, info = load_model(model, progress=progress)
    messages = openai_messages(trace_path)
    k = pick_turn(tok, messages, context)
    turn_a = render(tok, messages[:k])
    progress(f"session {trace_path.name}: turn A = messages[:{k}] = {len(turn_a)} tokens")

    root = Path(work_dir or tempfile.mkdtemp(prefix="jumpahead-bench-cache-"))
    ram_dir, ssd_dir = root / "ram", root / "ssd"
    for d in (ram_dir, ssd_dir):
        shutil.rmtree(d, ignore_errors=True)
    result: dict[str, Any] = {"model": info.name, "session": str(trace_path), "turn_index": k, "pid": os.getpid()}
    try:
        # RAM arm: turn A populates the cache, turn B hits it
        eng = Engine(m, tok, info, EngineConfig(prefix_cache_dir=str(ram_dir)))
        a = timed(eng, turn_a, gen_tokens)
        answer = tok.decode([t for t in a["tokens"] if t not in tok.eos_token_ids])
        turn_b = render(tok, messages[:k] + [{"role": "assistant", "content": answer}] + [messages[k + 1]])
        progress(f"turn A cold: ttft {a['ttft_s']}s; turn B = {len(turn_b)} tokens")
        t0 = time.perf_counter()
        assert eng.flush_prefix_cache(timeout=600), "SSD writes did not finish"
        flush_s = time.perf_counter() - t0
        shutil.copytree(ram_dir, ssd_dir, ignore=shutil.ignore_patterns(".lock"))
        after_a = eng.metrics()["prefix_cache"]
        ram = timed(eng, turn_b, gen_tokens)
        progress(f"turn B, RAM hit: ttft {ram['ttft_s']}s, cached {ram['cached_tokens']}")
        eng.close()
        del eng

        # cold arm
        eng = Engine(m, tok, info, EngineConfig(prefix_cache=False))
        cold = timed(eng, turn_b, gen_tokens)
        progress(f"turn B, cold: ttft {cold['ttft_s']}s")
        eng.close()
        del eng

        # mlx-lm's own path: stream_generate over turn B from an empty cache, which is
        # what mlx_lm.server does for a model whose cache cannot be trimmed (recurrent
        # layers: it recomputes the whole prompt every turn)
        mlx = None
        if mlx_lm:
            mlx = mlx_lm_timed(m, tok, turn_b, gen_tokens)
            progress(f"turn B, mlx-lm stream_generate (recomputes): ttft {mlx['ttft_s']}s")

        # The old server is gone when a server restarts: this process lets go of its
        # model and MLX's buffer cache first (measured: a parent still holding them made
        # the restarted process's first turn ~0.6 s slower here, in its buffer installs).
        import gc

        import mlx.core as mx

        del m
        gc.collect()
        mx.clear_cache()

        # SSD arm, last: restarts (new processes), each over a fresh copy of the directory as
        # it was after turn A with its pages dropped; the median restart is the figure
        restarts = []
        for i in range(max(1, ssd_restarts)):
            run_dir = root / f"ssd-restart-{i}"
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.copytree(ssd_dir, run_dir)
            dropped = drop_page_cache(run_dir)
            restarts.append(restarted(model, run_dir, turn_b, gen_tokens, root))
            shutil.rmtree(run_dir, ignore_errors=True)
            progress(f"turn B, SSD hit after a restart ({i + 1} of {ssd_restarts}): ttft {restarts[-1]['ttft_s']}s, "
                     f"cached {restarts[-1]['cached_tokens']}")
        ssd = sorted(restarts, key=lambda r: r["ttft_s"])[len(restarts) // 2]
        index_s, ssd_stats = ssd["index_s"], ssd["prefix_cache"]

    finally:
        if work_dir is None:
            shutil.rmtree(root, ignore_errors=True)

    def arm(r: dict[str, Any]) -> dict[str, Any]:
        return {"ttft_s": r["ttft_s"], "cached_tokens": r["cached_tokens"],
                "prefilled_tokens": len(turn_b) - r["cached_tokens"]}

    result.update({
        "turn_a_tokens": len(turn_a),
        "turn_a_generated": len(a["tokens"]),
        "turn_b_tokens": len(turn_b),
        "cold": arm(cold),
        "ram_hit": arm(ram),
        "ssd_hit": {**arm(ssd), "pid": ssd["pid"], "new_process": ssd["pid"] != os.getpid(), "startup_s": round(index_s, 3),
                    "page_cache_dropped": dropped, "bytes_read": ssd_stats.get("ssd_load_bytes", 0),
                    "restarts": len(restarts), "ttft_samples_s": [r["ttft_s"] for r in restarts],
                    "figure": "the median restart"},
        "ratio_ram": round(cold["ttft_s"] / ram["ttft_s"], 2),
        "ratio_ssd": round(cold["ttft_s"] / ssd["ttft_s"], 2),
        "targets": {"ram_ge_10x": cold["ttft_s"] >= 10 * ram["ttft_s"], "ssd_ge_30x": cold["ttft_s"] >= 30 * ssd["ttft_s"]},
        "same_tokens": {"ram_vs_cold": ram["tokens"] == cold["tokens"], "ssd_vs_cold": all(r["tokens"] == cold["tokens"] for r in restarts),
                        **({"mlx_lm_vs_cold": mlx["tokens"] == cold["tokens"]} if mlx else {})},
        **({"mlx_lm_recompute": {"ttft_s": mlx["ttft_s"], "ratio_vs_ram_hit": round(mlx["ttft_s"] / ram["ttft_s"], 2),
                                 "ratio_vs_ssd_hit": round(mlx["ttft_s"] / ssd["ttft_s"], 2)}} if mlx else {}),
        "cache_after_turn_a": {"ram_bytes": after_a["ram_bytes"], "ssd_bytes": after_a.get("ssd_bytes", 0),
                               "ssd_files": after_a.get("ssd_files", 0), "ssd_flush_s": round(flush_s, 3)},
        "kv_bytes_per_token": round(after_a["ram_bytes"] / max(1, after_a["published_tokens"])),
    })
    if CLAUDE_CODE.exists():
        result["billing_header"] = billing_header_effect(tok)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jumpahead bench cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="mlx-lm model path or hub id (default: the embedded default)")
    ap.add_argument("--context", type=int, default=4096, help="tokens of context of the replayed turn (default 4096)")
    ap.add_argument("--gen", type=int, default=16, help="tokens the model generates per turn (default 16)")
    ap.add_argument("--trace", default=None, help="a mini-swe-agent .traj.json (default: the one in ../shared)")
    ap.add_argument("--work-dir", default=None, help="keep the cache directories here (default: a temp dir)")
    ap.add_argument("--mlx-lm", action="store_true",
                    help="also time mlx-lm stream_generate over turn B from an empty cache (its server's path "
                         "for models with recurrent layers, which recomputes the prompt)")
    ap.add_argument("--restarts", type=int, default=3,
                    help="SSD arm: restarted processes, each over a fresh copy of the cache (default 3; the median is reported)")
    ap.add_argument("--out", default=None, help="also write the JSON result to this file")
    ap.add_argument("--ssd-child", default=None, help=argparse.SUPPRESS)  # the SSD arm's restarted process
    args = ap.parse_args(argv)
    if args.ssd_child:
        return ssd_child(args.ssd_child)
    from jumpahead.bench.output import emit

    if args.restarts < 1:
        ap.error("--restarts must be at least 1")
    return emit(run(args.model, args.context, args.gen, args.trace, args.work_dir, args.mlx_lm,
                    ssd_restarts=args.restarts), args.out)


if __name__ == "__main__":
    sys.exit(main())
