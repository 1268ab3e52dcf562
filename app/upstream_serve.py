"""`jumpahead serve --upstream URL ...`: the server in front of upstream engines.

No model is loaded: only the serving tokenizer (the default model's, or `--model`'s
folder), for rendering prompts (policies count tokens, traces keep ids) and for
parsing tool calls an upstream leaves in its text.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jumpahead.proxy.upstream.engine import UpstreamEngine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("upstream mode (serve from OpenAI-compatible engines instead of in-process)")
    group.add_argument("--upstream", action="append", default=[], metavar="URL",
                       help="an upstream chat-completions base URL (vLLM, SGLang, mlx_lm.server, another "
                            "jumpahead), e.g. http://10.0.0.5:8000/v1; repeat for replicas (each session "
                            "stays on one). --model then only names the tokenizer")
    group.add_argument("--upstream-key-env", default=None, metavar="NAME",
                       help="environment variable holding the upstream's API key (sent as a Bearer token)")
    group.add_argument("--upstream-model", default=None, metavar="NAME",
                       help="the model name sent upstream (default: what its /v1/models lists, else none)")
    group.add_argument("--upstream-routing", choices=("affinity", "round-robin"), default="affinity",
                       help="affinity (default): each session on one replica by consistent hashing; "
                            "round-robin: every request to the next replica")
    group.add_argument("--upstream-continuation", choices=("auto", "on", "off"), default="auto",
                       help="jumps as continuation requests (continue_final_message): auto (default) when the "
                            "upstream says it is jumpahead, vLLM or SGLang")
    group.add_argument("--upstream-connect-timeout", type=float, default=5.0, metavar="S",
                       help="seconds to connect to an upstream (default: 5)")
    group.add_argument("--upstream-read-timeout", type=float, default=600.0, metavar="S",
                       help="most seconds between two bytes of an upstream answer (default: 600)")


def config_from_args(args: argparse.Namespace) -> Any:
    """The UpstreamConfig; ValueError names a bad option."""
    from jumpahead.proxy.upstream.engine import UpstreamConfig, base_url

    key = None
    if args.upstream_key_env:
        key = os.environ.get(args.upstream_key_env)
        if not key:
            raise ValueError(f"--upstream-key-env {args.upstream_key_env}: that environment variable is not set")
    for url in args.upstream:
        base_url(url)
    if args.upstream_connect_timeout <= 0 or args.upstream_read_timeout <= 0:
        raise ValueError("--upstream-connect-timeout and --upstream-read-timeout must be > 0")
    continuation = {"auto": None, "on": True, "off": False}[args.upstream_continuation]
    return UpstreamConfig(urls=list(args.upstream), api_key=key, model=args.upstream_model,
                          routing=args.upstream_routing, connect_timeout_s=args.upstream_connect_timeout,
                          read_timeout_s=args.upstream_read_timeout, continuation=continuation)


def upstream_generator(engine: "UpstreamEngine") -> Any:
    """`generate(prompt_text, max_tokens) -> text` on the upstream (policies'
    RequestContext.generate, e.g. model-written summaries; blocking, off the loop)."""

    import httpx

    from jumpahead.proxy.upstream.engine import _upstream_message

    def generate(prompt_text: str, max_tokens: int) -> str:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt_text}],
                                "max_tokens": max(1, int(max_tokens)), "temperature": 0.0}
        if engine.model:
            body["model"] = engine.model
        errors = []
        for replica in engine.replicas.order(""):
            try:
                r = httpx.post(f"{replica.url}/chat/completions", json=body, headers=engine._headers(),
                               timeout=engine.config.read_timeout_s)
            except httpx.HTTPError as exc:
                errors.append(f"{replica.url}: {type(exc).__name__}")
                continue
            if r.status_code != 200:
                raise RuntimeError(f"upstream {replica.url} answered {r.status_code}: {_upstream_message(r.content)}")
            return str(r.json()["choices"][0]["message"].get("content") or "")
        raise RuntimeError("no upstream replica answered: " + "; ".join(errors))

    return generate


def run(args: argparse.Namespace, policy_specs: list, trace_dir: str | None, access: Any = None,
        script: Any = None) -> int:
    """`script` (serve --script, replay --live): each request is answered with the next
    recorded turn, as in-process, without asking the upstream."""
    log = logging.getLogger("jumpahead.serve")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per upstream request and health check
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"jumpahead: {exc}", file=sys.stderr)
        return 2

    from jumpahead.traces.analysis import load_tokenizer

    from jumpahead.proxy.upstream.engine import UpstreamEngine

    try:
        tokenizer = load_tokenizer(args.model)
    except Exception as exc:  # noqa: BLE001  (a bad folder, no tokenizer)
        print(f"jumpahead: cannot load the tokenizer of {args.model or 'the default model'}: {exc}", file=sys.stderr)
        return 2
    engine = UpstreamEngine(config, tokenizer, tokenizer_name=args.model or "SmolLM2-135M-Instruct")
    for note in engine.probe():
        log.warning("%s", note)
    log.info("upstream mode: %s (%s routing), model %s, jumps %s", ", ".join(engine.urls), config.routing,
             engine.model or "(the upstream's default)", "on" if engine.continuation else "off")

    import uvicorn

    from jumpahead.policies.runtime import PolicyHooks

    from jumpahead.proxy.server import create_app

    hooks: list = [PolicyHooks(policy_specs, tokenizer, engine.context_length, upstream_generator(engine))]
    if policy_specs:
        log.info("policies: %s", ", ".join(str(s) for s in policy_specs))
    if trace_dir:
        from jumpahead.traces.recorder import TraceRecorder

        hooks.append(TraceRecorder.for_engine(trace_dir, engine, server={"upstream": engine.urls,
                                                                         "routing": config.routing}))
        log.info("recording traces in %s", trace_dir)
    try:
        app = create_app(engine, script=script, hooks=hooks, access=access,
                         **({"max_body_bytes": args.max_body_bytes} if getattr(args, "max_body_bytes", None) else {}))
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    finally:
        engine.close()
    return 0
