"""`jumpahead bench fill`: proposal methods side by side with ordinary decoding.

Tool-call arm (`run_tool_call_arm`): turns that must answer with a tool call
(`tool_choice` required), with the tool schemas and system prompts the real clients
send (../shared/fixtures/clients/: pi's read/bash/edit/write, mini-swe-agent's bash).
Arms, interleaved per turn (ABBA order) in one process on one loaded model:

- `constrained`: ordinary constrained decoding (the grammar masks sampling; no proposers);
- `strict`: the same constraint plus strict fill (template scaffold + grammar
  jump-forward, verified, engine/strict/fill.py); its output must equal `constrained`'s
  token for token, and the bench fails if it does not;
- `strict_asserted` (optional): strict tokens asserted unverified (DESIGN's mode); its
  output may differ in tokenization, so only its match count is reported.

Generation time is the row's first-to-last token time (Timings.decode_s); whole-turn
wall is submit to finish as the caller sees it. Every prompt runs once before the
measured rounds so that all arms find the same prefix-cache state and compiled grammar.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from jumpahead.engine.engine import Engine
from jumpahead.engine.methods.registry import SERVER_DEFAULT
from jumpahead.engine.types import GenerationRequest

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "clients"

# What each arm runs: ordinary constrained decoding, strict fill alone (verified, or
# asserted by `StrictFill.asserted`), and the server's default (strict + SERVER_DEFAULT).
ARM_METHODS: dict[str, list[str]] = {"constrained": ["none"], "strict": ["strict"], "strict_asserted": ["strict"],
                                     "defaults": ["strict", *SERVER_DEFAULT]}

TASKS: dict[str, list[str]] = {
    "pi-openai": [
        "create hello.txt containing hello world",
        "Read the file src/main.py",
        "Run the test suite with pytest",
        "In app.py, rename the function foo to bar",
    ],
    "mini-swe-agent": [
        "create hello.txt containing hello world",
        "list the python files in the repository",
        "show the last 20 lines of server.log",
    ],
}


def tool_call_turns(
    tokenizer: Any, clients: Sequence[str] = tuple(TASKS), fixtures: Path = FIXTURES, tasks: int | None = None
) -> list[dict]:
    """One turn per (client, task), at most `tasks` per client: the client's system
    prompt and tools, the task as the user's request. Each: name, prompt ids, tools, grammar."""
    turns = []
    for client in clients:
        body = json.loads((fixtures / client / "001_POST_v1_chat_completions.json").read_text())["body"]
        tools = body["tools"]
        first = body["messages"][-1]
        original = first["content"] if isinstance(first["content"], str) else first["content"][0]["text"]
        original = original.split("\n")[0]
        for task in TASKS.get(client, [])[:tasks]:
            messages = []
            for m in body["messages"]:
                content = m["content"] if isinstance(m["content"], str) else "\n\n".join(p.get("text", "") for p in m["content"])
                if m is first:
                    content = content.replace(original, original.replace(original.split(": ", 1)[-1], task), 1) \
                        if ": " in original else task
                messages.append({"role": m["role"], "content": content})
            prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
            turns.append({"name": f"{client}: {task}", "prompt": prompt, "tools": tools,
                          "grammar": {"type": "tool_call", "tools": tools}})
    return turns


def _one(engine: Engine, turn: dict, arm: str, max_tokens: int, progress: Callable[[str], None] | None = None) -> dict:
    req = GenerationRequest(prompt=turn["prompt"], max_tokens=max_tokens, grammar=turn["grammar"], tools=turn["tools"],
                            methods=ARM_METHODS[arm])
    engine.strict.asserted = arm == "strict_asserted"
    try:
        t0 = time.perf_counter()
        chunks = engine.generate_sync(req)
        wall = time.perf_counter() - t0
    finally:
        engine.strict.asserted = False
    last = chunks[-1]
    kinds = [k for c in chunks for k in c.kinds]
    if progress is not None:
        progress(f"{arm:>15} {len(kinds):3d} tokens ({kinds.count('strict')} strict) gen {last.timings.decode_s:6.2f}s "
                 f"wall {wall:6.2f}s  {turn['name']}")
    return {
        "tokens": [t for c in chunks for t in c.tokens],
        "gen_s": last.timings.decode_s if last.timings else 0.0,
        "wall_s": wall,
        "strict": kinds.count("strict"),
        "forwards": (last.fill or {}).get("forwards", 0),
        "finish": last.finish_reason,
    }


def run_tool_call_arm(
    engine: Engine,
    repeats: int = 2,
    max_tokens: int = 96,
    clients: Sequence[str] = tuple(TASKS),
    asserted: bool = False,
    fixtures: Path = FIXTURES,
    tasks: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Strict fill vs ordinary constrained decoding on tool-call turns (see module doc).

    Returns a JSON-able dict: per-arm medians over `repeats` of the summed generation
    time and whole-turn wall, the reduction of strict vs constrained, token counts, and
    per-turn detail. Raises AssertionError if strict and constrained outputs differ.
    """
    turns = tool_call_turns(engine.tokenizer, clients, fixtures, tasks)
    arms = ["constrained", "strict", "defaults"] + (["strict_asserted"] if asserted else [])
    for turn in turns:  # warm-up: prefix cache, grammar compile, template scaffold
        _one(engine, turn, "constrained", max_tokens, progress)
    samples: dict[str, list[list[dict]]] = {a: [] for a in arms}
    for r in range(repeats):
        runs: dict[str, list[dict]] = {a: [] for a in arms}
        for i, turn in enumerate(turns):
            order = arms if (i + r) % 2 == 0 else arms[::-1]
            for arm in order:
                runs[arm].append(_one(engine, turn, arm, max_tokens, progress))
        for arm in arms:
            samples[arm].append(runs[arm])
    # identical outputs: the exact arms (strict verified, the defaults) must reproduce
    # constrained decoding token for token, in every repeat
    base = samples["constrained"][0]
    for arm in ("constrained", "strict", "defaults"):
        for rep in samples[arm]:
            for turn, a, b in zip(turns, base, rep):
                if a["tokens"] != b["tokens"]:
                    raise AssertionError(f"bench fill: arm {arm!r} differs from constrained decoding on {turn['name']!r}")

    def total(arm: str, key: str) -> float:
        return statistics.median(sum(x[key] for x in rep) for rep in samples[arm])

    summary: dict[str, Any] = {}
    for arm in arms:
        first = samples[arm][0]
        summary[arm] = {
            "gen_s": round(total(arm, "gen_s"), 3),
            "wall_s": round(total(arm, "wall_s"), 3),
            "tokens": sum(len(x["tokens"]) for x in first),
            "strict_tokens": sum(x["strict"] for x in first),
            "forwards": sum(x["forwards"] for x in first),
        }
    c, s, d = summary["constrained"], summary["strict"], summary["defaults"]
    out: dict[str, Any] = {
        "bench": "fill.tool_call",
        "model": engine.info.name,
        "turns": len(turns),
        "repeats": repeats,
        "max_tokens": max_tokens,
        "arms": summary,
        "strict_vs_constrained": {
            "gen_time_reduction": round(1 - s["gen_s"] / c["gen_s"], 3) if c["gen_s"] else None,
            "wall_reduction": round(1 - s["wall_s"] / c["wall_s"], 3) if c["wall_s"] else None,
            "identical_outputs": True,
            "target": "gen_time_reduction >= 0.35",
        },
        "defaults_vs_constrained": {  # the server's default methods (strict + SERVER_DEFAULT)
            "methods": ARM_METHODS["defaults"],
            "gen_time_reduction": round(1 - d["gen_s"] / c["gen_s"], 3) if c["gen_s"] else None,
            "wall_reduction": round(1 - d["wall_s"] / c["wall_s"], 3) if c["wall_s"] else None,
            "identical_outputs": True,
        },
        "per_turn": [
            {
                "turn": turn["name"],
                "tokens": len(base[i]["tokens"]),
                "finish": base[i]["finish"],
                "text": engine.tokenizer.decode(base[i]["tokens"]),
                **{f"{arm}_gen_s": round(statistics.median(rep[i]["gen_s"] for rep in samples[arm]), 3) for arm in arms},
                "strict_tokens": samples["strict"][0][i]["strict"],
            }
            for i, turn in enumerate(turns)
        ],
    }
    if asserted:
        same = sum(a["tokens"] == b["tokens"] for a, b in zip(base, samples["strict_asserted"][0]))
        out["strict_asserted_vs_constrained"] = {
            "gen_time_reduction": round(1 - summary["strict_asserted"]["gen_s"] / c["gen_s"], 3) if c["gen_s"] else None,
            "identical_outputs": f"{same}/{len(turns)}",
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """`jumpahead bench fill`: the tool-call arm here, then the echo arms
    (bench/echo.py: copy-heavy, nothing to copy, mixed batch of 4)."""
    import argparse

    from jumpahead.engine.engine import EngineConfig
    from jumpahead.engine.methods.registry import parse_methods

    from . import echo
    from jumpahead.bench.output import emit

    parser = argparse.ArgumentParser(prog="jumpahead bench fill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--asserted", action="store_true", help="also run strict fill with unverified assertion")
    parser.add_argument("--skip-echo", action="store_true", help="only the tool-call arm")
    parser.add_argument("--skip-tool-calls", action="store_true", help="only the echo arms")
    parser.add_argument("--methods", default=None, metavar="LIST",
                        help="methods of the echo arms (default: the server's, %s)" % ",".join(SERVER_DEFAULT))
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")
    args = parser.parse_args(argv)
    try:
        methods = parse_methods(args.methods)
    except ValueError as exc:
        parser.error(str(exc))
    out: dict[str, Any] = {"bench": "fill"}
    if not args.skip_tool_calls:
        # RAM prefix cache only: the warm-up pass gives every arm the same cache state.
        engine = Engine.load(args.model, EngineConfig(prefix_cache_ssd=False), progress=lambda s: None)
        try:
            out["tool_calls"] = run_tool_call_arm(engine, args.repeats, args.max_tokens, asserted=args.asserted)
        finally:
            engine.close()
    if not args.skip_echo:
        out["echo"] = echo.run(args.model, args.max_tokens, args.repeats, methods=methods)
    return emit(out, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
