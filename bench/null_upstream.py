"""A null upstream for `jumpahead bench proxy`: an OpenAI-compatible chat endpoint that
answers at once with a fixed 4-token reply (plain or as SSE), no model behind it.

Against it, the pass-through's added latency is the front's own cost: a model upstream
on the same small machine also competes with the front for its cores, which a front in
front of a serving cluster does not. Not a test double: nothing here stands in for the
thing measured (the front)."""

from __future__ import annotations

import argparse
import sys

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

WORDS = ["Hello", " there", ",", " hi", "."]
USAGE = {"prompt_tokens": 10, "completion_tokens": len(WORDS), "total_tokens": 10 + len(WORDS)}


def _json(value: object) -> Response:
    return Response(orjson.dumps(value), media_type="application/json")


async def _models(_: Request) -> Response:
    return _json({"object": "list", "data": [{"id": "null", "object": "model", "owned_by": "jumpahead"}]})


async def _health(_: Request) -> Response:
    return _json({"status": "ok"})


async def _chat(request: Request) -> Response:
    body = orjson.loads(await request.body())
    if not body.get("stream"):
        return _json({"id": "null", "object": "chat.completion", "created": 0, "model": "null", "usage": USAGE,
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": "".join(WORDS)}}]})

    def event(choice: dict, **extra: object) -> bytes:
        return b"data: " + orjson.dumps({"id": "null", "object": "chat.completion.chunk", "created": 0,
                                         "model": "null", "choices": [choice], **extra}) + b"\n\n"

    async def events():
        for word in WORDS:
            yield event({"index": 0, "delta": {"content": word}, "finish_reason": None})
        yield event({"index": 0, "delta": {}, "finish_reason": "stop"}, usage=USAGE)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


app = Starlette(routes=[Route("/v1/models", _models), Route("/health", _health),
                        Route("/v1/chat/completions", _chat, methods=["POST"])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jumpahead.bench.null_upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
