"""The typed interfaces: the Engine protocol (engine/interface.py), the HTTP
WireProtocol (proxy/wire.py), and the names a policy author imports from
`jumpahead.policies`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter

from jumpahead.engine.interface import Engine, LocalEngine
from jumpahead.proxy.anthropic_messages import MessagesProtocol
from jumpahead.proxy.openai_chat import ChatProtocol
from jumpahead.proxy.openai_responses import ResponsesProtocol
from jumpahead.proxy.response_store import ResponseStore
from jumpahead.proxy.server import create_app
from jumpahead.proxy.signing import default_signer
from jumpahead.proxy.upstream.engine import UpstreamConfig, UpstreamEngine
from jumpahead.proxy.wire import WireContext, WireProtocol, WireStream


def test_both_engines_are_engines(engine) -> None:
    upstream = UpstreamEngine(UpstreamConfig(urls=["http://127.0.0.1:9/v1"]), engine.tokenizer)
    assert isinstance(engine, Engine) and isinstance(engine, LocalEngine)
    assert isinstance(upstream, Engine) and not isinstance(upstream, LocalEngine)
    upstream.close()


def test_the_three_protocols_are_wire_protocols(engine) -> None:
    ctx = WireContext(engine, Counter(), default_signer(), ResponseStore())
    protocols = [ChatProtocol(ctx), MessagesProtocol(ctx), ResponsesProtocol(ctx)]
    assert all(isinstance(p, WireProtocol) for p in protocols)
    assert [p.protocol for p in protocols] == ["chat", "messages", "responses"]
    # a parsed chat request streams through a WireStream
    chat = ChatProtocol(ctx)
    asyncio.run(chat.parse({"messages": [{"role": "user", "content": "hi"}], "stream": True}))
    assert isinstance(chat.stream(None, "m"), WireStream)
    # every generation route runs the one generic handler, under its old name
    app = create_app(engine)
    by_path = {r.path: r.endpoint for r in app.routes if getattr(r, "endpoint", None) is not None}
    handlers = [by_path[p] for p in ("/v1/chat/completions", "/chat/completions", "/v1/messages", "/messages",
                                     "/v1/responses", "/responses")]
    assert len({h.__code__ for h in handlers}) == 1
    assert [h.__name__ for h in handlers[::2]] == ["chat_completions", "messages", "responses"]


def test_policy_authors_import_from_the_package() -> None:
    """`from jumpahead.policies import ...` gives every name of the policy API, and the
    package imports no core or proxy module until a context name is asked for."""
    code = ("import sys\n"
            "from jumpahead.policies import Policy, Intervention, RequestContext, SessionState, BoundaryEvent, "
            "TurnResult, BOUNDARIES, Boundary, Proposer, Proposal, RowView\n"
            "assert not [m for m in sys.modules if m.startswith(('jumpahead.core', 'jumpahead.proxy'))], sorted(sys.modules)\n"
            "from jumpahead.policies import Turn, Message, ToolCall, Tool\n"
            "import jumpahead.policies as p\n"
            "assert all(hasattr(p, n) for n in p.__all__)\n"
            "class Mine(Policy):\n"
            "    def on_tool_name(self, event):\n"
            "        return Intervention(text='x')\n"
            "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
