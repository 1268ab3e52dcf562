"""`jumpahead serve`: load the model and serve it over HTTP with uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from typing import Any

LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_SCRIPT_SLICE = 4096  # most scripted tokens in one round (its logits are [1, slice, vocab])


def at_least(text: str, minimum: int) -> int:
    """`text` as a whole number of at least `minimum` (else argparse's usage error)."""
    value = int(text)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}")
    return value


def _positive(text: str) -> int:  # argparse names the type in its errors: "invalid _positive value"
    return at_least(text, 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jumpahead.engine.methods.registry import known as known_methods

    parser.add_argument("--model", default=None, metavar="PATH_OR_ID",
                        help="an mlx-lm model folder, a GGUF file (llama, gemma3, qwen2, qwen3; converted once "
                             "into the cache), 'gemma3-270m' (Gemma 3 270M base, from PyPI), or a hub id "
                             "(default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--adapter", default=None, metavar="NAME|DIR",
                        help="a LoRA adapter fused into the model at load: an mlx-lm adapter folder, or "
                             "'smol-agent' (shipped: teaches the default model the tools of jumpahead live)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    parser.add_argument("--max-batch", type=_positive, default=8, help="rows decoded together (default: 8)")
    parser.add_argument("--blas-threads", type=_positive, default=None, metavar="N",
                        help="threads of the BLAS library MLX's CPU matmuls run on (default: "
                             "$JUMPAHEAD_BLAS_THREADS, else all cores; `jumpahead doctor` shows the choice)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="log level (default: info)")
    parser.add_argument("--methods", default=None, metavar="LIST",
                        help="proposal methods for requests that name none, comma-separated: "
                             f"{', '.join(known_methods())}, or 'none' for ordinary decoding "
                             "(default: echo plus checked strict fill, the exact methods that pay)")
    parser.add_argument("--draft-model", default=None, metavar="PATH|truncated[:N]",
                        help="a draft model for method 'draft' (same tokenizer family as --model); "
                             "'truncated:N' builds the default model's first N layers (default N=4)")
    parser.add_argument("--drafter", default="auto", metavar="auto|none|PATH",
                        help="a trained drafter head for method 'drafter' (jumpahead train-drafter): 'auto' "
                             "(default) loads the one shipped for the default model when that model is served, "
                             "'none' loads none")
    parser.add_argument("--mtp", default="auto", metavar="auto|none|PATH",
                        help="the checkpoint's multi-token-prediction layer for method 'mtp' (Hugging Face folders "
                             "keep it: qwen3_next / qwen3_5 under mtp.*, deepseek_v3 / glm4_moe / glm4_moe_lite as "
                             "model.layers.N): 'auto' (default) loads the served folder's own; PATH reads it from that "
                             "folder (the original checkpoint of a converted model); 'none' loads none. Method "
                             "'mtp' is opt-in (--methods echo,mtp) unless a measurement beside the MTP weights "
                             "(mtp_measured.json) shows it paying on this model")
    parser.add_argument("--max-proposal", type=_positive, default=16, metavar="K",
                        help="most verified proposal tokens a row carries into one round (default: 16)")
    parser.add_argument("--no-cost-aware", action="store_true",
                        help="carry every verified proposal up to --max-proposal instead of sizing it by "
                             "the row's acceptance rate and the measured cost of a token")
    parser.add_argument("--objective", choices=("throughput", "latency"), default="throughput",
                        help="what a verified proposal must pay for: 'throughput' (default) lets a row "
                             "verify in a shared batch only while requests wait for a slot or when the "
                             "batch waits on it last; 'latency' sizes each row's proposals for that row's "
                             "own speed, at a few percent of its neighbours'")
    parser.add_argument("--no-prefix-cache", action="store_true",
                        help="do not reuse cached prompt prefixes across requests")
    parser.add_argument("--no-ssd-cache", action="store_true",
                        help="keep the prefix cache in RAM only (no files that survive restarts)")
    parser.add_argument("--prefix-cache-dir", default=None, metavar="DIR",
                        help="SSD tier folder (default: $JUMPAHEAD_HOME or ~/.cache/jumpahead, "
                             "/prompt-cache/<model>)")
    parser.add_argument("--prefix-cache-ram-gb", type=float, default=2.0, metavar="GB",
                        help="RAM budget of the prefix cache (default: 2)")
    parser.add_argument("--prefix-cache-ssd-gb", type=float, default=16.0, metavar="GB",
                        help="disk cap of the SSD tier (default: 16)")
    parser.add_argument("--kv-bits", type=int, default=None, choices=(2, 3, 4, 5, 6, 8),
                        help="store attention keys and values quantized to this many bits (8 or 4 as in "
                             "mlx-lm's --kv-bits; recurrent state stays as it is); default: full precision")
    parser.add_argument("--kv-value-bits", type=int, default=None, choices=(2, 3, 4, 5, 6, 8),
                        help="bits of the values when they differ from the keys' (e.g. --kv-bits 8 "
                             "--kv-value-bits 4)")
    parser.add_argument("--kv-group-size", type=int, default=64, choices=(32, 64, 128),
                        help="elements sharing one scale and bias in the quantized KV cache (default: 64)")
    parser.add_argument("--script", default=None, metavar="FILE",
                        help="forced-continuation replay: each request is answered with the next turn of FILE "
                             "(JSONL: {\"reasoning\", \"text\", \"tool_calls\"} per line), appended through the "
                             "model as asserted tokens")
    parser.add_argument("--trace-dir", default=None, metavar="DIR",
                        help="record every turn into DIR/<session>.jsonl: the request (secrets redacted), "
                             "the context after policies, the answer with each token's provenance, timings")
    parser.add_argument("--policy", action="append", default=[], metavar="NAME[:key=value,...]",
                        help="run a policy on every request (repeatable, in order): a built-in name "
                             "(compaction, masking, thinking-clearing, fit, jump, ...) or a user policy "
                             "package.module:Class, each optionally followed by :key=value,...")
    parser.add_argument("--no-fit", action="store_true",
                        help="the embedded default model runs policy 'fit' (shrink prompts over its 8k window: "
                             "old tool results, thinking, tool descriptions, the middle of the history); "
                             "this turns it off (with --model or --script, fit runs only if --policy fit asks)")
    parser.add_argument("--policy-config", default=None, metavar="FILE.toml",
                        help="policies from a TOML file ([[policy]] tables: name = \"...\" plus options), "
                             "run before the --policy ones")
    parser.add_argument("--script-prompt-limit", type=_positive, default=None, metavar="N",
                        help="script mode: cut longer prompts to N tokens before prefill (a fixed head and the tail; the cut "
                             "stays put while the agent's history grows, so later turns hit the prefix cache); "
                             "the scripted answer does not depend on them (default: the model's context)")
    from .upstream_serve import add_arguments as add_upstream_arguments

    add_upstream_arguments(parser)
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every endpoint but "
                             "/health (default: $JUMPAHEAD_API_KEY; unset: no key)")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                        help="let the web page at this origin (http://host:port) call the server, with CORS "
                             "(repeatable; default: browser requests from any origin are refused)")
    parser.add_argument("--max-body-bytes", type=_positive, default=32 << 20, metavar="N",
                        help="refuse request bodies over N bytes with 413 (default: 32 MiB)")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _writable_dir(path: str) -> str | None:
    """Why `path` cannot hold trace files (None: it can); created if missing."""
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"cannot create or write the directory: {exc.strerror or exc}"
    return None


def _policy_specs(args: argparse.Namespace) -> list:
    """--policy-config's then --policy's specs, each imported and instantiated once
    (PolicyError, a ValueError, names the bad one)."""
    from jumpahead.policies.registry import load_config, parse_spec

    specs = list(load_config(args.policy_config)) if getattr(args, "policy_config", None) else []
    specs += [parse_spec(text) for text in getattr(args, "policy", None) or []]
    # The embedded model's 8k window is smaller than what agents send (Claude Code
    # ~20k tokens): fit runs last, on what the other policies left. Script mode keeps
    # its own prompt cut (--script-prompt-limit): replay measures the recorded prompts.
    if getattr(args, "model", None) is None and not getattr(args, "no_fit", False) \
            and not getattr(args, "script", None) and not getattr(args, "upstream", None) \
            and not any(s.name == "fit" for s in specs):
        specs.append(parse_spec("fit"))
    for spec in specs:
        spec.build()
    return specs


def method_specs(args: argparse.Namespace) -> dict[str, str | None]:
    """The specs that these arguments give the registry's stateful methods, each by the
    option its Lifecycle names (--draft-model, --drafter, --mtp): what the Engine loads
    and attaches (EngineConfig.method_specs; engine/methods/registry.py attach_methods)."""
    from jumpahead.engine.methods.registry import REGISTRY

    return {m.name: getattr(args, m.lifecycle.flag.lstrip("-").replace("-", "_"), None)
            for m in REGISTRY.values() if m.lifecycle is not None and m.lifecycle.flag}


def engine_config(args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    """The EngineConfig `jumpahead serve` runs with these arguments, and the default
    methods (ValueError: bad --methods or --kv-* values). `bench models` loads its
    models through this, as serve does: the Engine loads and attaches --draft-model,
    --drafter and --mtp (EngineConfig.method_specs; engine/methods/registry.py attach_methods),
    and a drafter or MTP layer whose measurement pays joins the defaults unless
    --methods chose them (measured_defaults); a problem is a MethodError."""
    from jumpahead.engine.engine import EngineConfig
    from jumpahead.engine.kv.kv_format import parse_kv_format
    from jumpahead.engine.methods.registry import parse_methods

    methods = parse_methods(args.methods)
    kv_format = parse_kv_format(args.kv_bits, args.kv_value_bits, args.kv_group_size)
    config = EngineConfig(
        kv_format=kv_format,
        max_batch=args.max_batch,
        max_proposal=args.max_proposal,
        cost_aware=not args.no_cost_aware,
        objective=args.objective,
        default_methods=methods,
        prefix_cache=not args.no_prefix_cache,
        prefix_cache_ssd=not args.no_ssd_cache,
        prefix_cache_dir=args.prefix_cache_dir,
        prefix_cache_ram_bytes=int(args.prefix_cache_ram_gb * (1 << 30)),
        prefix_cache_ssd_bytes=int(args.prefix_cache_ssd_gb * (1 << 30)),
        method_specs=method_specs(args),
        measured_defaults=args.methods is None,
    )
    return config, methods


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("jumpahead.serve")
    from jumpahead.proxy.access import access_config

    try:
        access = access_config(getattr(args, "api_key", None), getattr(args, "allow_origin", None) or [], args.host)
    except ValueError as exc:  # a bad --allow-origin or an empty key
        print(f"jumpahead: {exc}", file=sys.stderr)
        return 2
    if not _is_loopback(args.host):
        log.warning("binding %s: anyone who can reach this address can use the model%s", args.host,
                    "" if access.api_key else " (no --api-key)")

    script = None
    if getattr(args, "script", None):
        from jumpahead.core.script import Script, ScriptError

        try:
            script = Script.load(args.script, prompt_limit=args.script_prompt_limit)
        except ScriptError as exc:
            print(f"jumpahead: {exc}", file=sys.stderr)
            return 2
        log.info("script mode: %d turns from %s", len(script.turns), args.script)

    trace_dir = getattr(args, "trace_dir", None)
    if trace_dir:
        problem = _writable_dir(trace_dir)
        if problem:
            print(f"jumpahead: --trace-dir {trace_dir}: {problem}", file=sys.stderr)
            return 2

    try:
        policy_specs = _policy_specs(args)
    except ValueError as exc:  # PolicyError: a bad spec, a module that does not import, bad options
        print(f"jumpahead: {exc}", file=sys.stderr)
        return 2

    if getattr(args, "upstream", None):  # tokens from upstream engines (proxy/upstream/)
        from .upstream_serve import run as run_upstream

        return run_upstream(args, policy_specs, trace_dir, access, script)

    import jumpahead.engine  # noqa: F401  (chooses and binds the BLAS before mlx is imported)
    from jumpahead.engine.machine.blas import blas_info, set_blas_threads
    from jumpahead.engine.engine import Engine
    from jumpahead.engine.methods.registry import MethodError

    if args.blas_threads:
        set_blas_threads(args.blas_threads)
    blas = blas_info()
    log.info("BLAS: %s (%s threads): %s", blas["library"], blas["threads"] or "-", blas["note"])

    try:
        config, methods = engine_config(args)
    except ValueError as exc:
        print(f"jumpahead: {exc}", file=sys.stderr)
        return 2
    if script is not None:
        # A scripted turn goes in as one asserted slice where it fits: fewer, wider rounds.
        config.max_asserted = max(config.max_asserted, min(script.max_bytes() + 8, MAX_SCRIPT_SLICE))
    adapter = None
    if getattr(args, "adapter", None):
        from jumpahead.engine.model.lora import resolve_adapter

        try:
            adapter = str(resolve_adapter(args.adapter))
        except FileNotFoundError as exc:
            print(f"jumpahead: {exc}", file=sys.stderr)
            return 2
    try:
        engine = Engine.load(args.model, config, progress=log.info, adapter=adapter)
    except MethodError as exc:  # a --draft-model/--drafter/--mtp refused, or --methods naming what is not loaded
        print(f"jumpahead: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"jumpahead: cannot load model {args.model or '(default)'}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2

    import uvicorn

    from jumpahead.proxy.server import create_app

    from jumpahead.policies.runtime import PolicyHooks, engine_generator

    # Policies first: the recorder then records the context after them.
    hooks: list = [PolicyHooks(policy_specs, engine.tokenizer, engine.context_length, engine_generator(engine))]
    if policy_specs:
        log.info("policies: %s", ", ".join(str(s) for s in policy_specs))
    if trace_dir:
        from jumpahead.traces.recorder import TraceRecorder

        hooks.append(TraceRecorder.for_engine(trace_dir, engine, server={
            "methods": list(methods), "max_batch": args.max_batch, "objective": args.objective,
            "script": getattr(args, "script", None), "draft_model": args.draft_model,
            "adapter": adapter}))
        log.info("recording traces in %s", trace_dir)
    try:
        app = create_app(engine, script=script, hooks=hooks, access=access,
                         max_body_bytes=getattr(args, "max_body_bytes", 32 << 20))
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    timeout_graceful_shutdown=5)
    finally:
        engine.close()
    return 0
