"""Upstream mode: serve the model's tokens from OpenAI-compatible engines over HTTP.

`jumpahead serve --upstream URL [--upstream URL ...]` swaps the in-process engine for
`UpstreamEngine` (engine.py), which speaks the engine's interface to the server, so the
wire protocols, output parser, policies and recorder run unchanged:

- translate.py: a Turn as a chat-completions body; the upstream's deltas as text in the
  model's own output format (reasoning, `<tool_call>` blocks) for the proxy's parser;
- replicas.py: the replica set: consistent-hash session affinity, health, load, errors;
- engine.py: the pooled httpx client, streaming, cancellation, error mapping, and jumps
  applied as continuation requests (`continue_final_message`).

Its benchmark, `jumpahead bench proxy`, is bench/proxy.py.
"""
