"""Access control on the real server: API key, browser origins and CORS, Host checks
(DNS rebinding), the request-body limit, and that keys reach no log and no trace.

The server is the real app (uvicorn, the default model) started with
`tests.serving.serve`; clients are httpx and the official OpenAI / Anthropic SDKs."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from jumpahead.proxy import access as access_mod
from jumpahead.proxy.access import AccessConfig, access_config, host_name, normalize_origin
from jumpahead.proxy.openapi import openapi_document

from .serving import cli_process, free_port, interrupt, serve, wait_health

KEY = "sk-test-0123456789abcdef-SECRET"
UI = "http://localhost:5173"
CHAT = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "max_output_tokens": 1, "input": "hi"}
BODIES = {"/v1/chat/completions": CHAT, "/chat/completions": CHAT, "/v1/messages": MESSAGES,
          "/messages": MESSAGES, "/v1/messages/count_tokens": MESSAGES, "/messages/count_tokens": MESSAGES,
          "/v1/responses": RESPONSES, "/responses": RESPONSES}


@pytest.fixture(scope="module")
def keyed(engine):
    with serve(engine, access=AccessConfig.build(KEY, [UI]), max_body_bytes=64 * 1024) as url:
        yield url


@pytest.fixture(scope="module")
def open_server(engine):
    with serve(engine) as url:  # create_app's defaults: no key, no origins, loopback names
        yield url


def _anthropic_path(path: str) -> bool:
    return path.startswith(("/v1/messages", "/messages"))


def assert_error_shape(r: httpx.Response, path: str, status: int) -> str:
    """The protocol's error shape with a message; returns the message."""
    assert r.status_code == status, (path, r.status_code, r.text[:300])
    body = r.json()
    if _anthropic_path(path):
        assert body["type"] == "error" and isinstance(body["error"]["type"], str)
        message = body["error"]["message"]
    else:
        assert isinstance(body["error"]["type"], str)
        message = body["error"]["message"]
    assert isinstance(message, str) and message
    return message


def _operations() -> list[tuple[str, str]]:
    """Every (method, concrete path) the published document lists."""
    ops = []
    for path, item in openapi_document()["paths"].items():
        concrete = path.replace("{response_id}", "resp_missing").replace("{model_id}", "some-model")
        ops += [(method.upper(), concrete) for method in item]
    return ops


# --- API key ---------------------------------------------------------------------------


def test_every_endpoint_but_health_needs_the_key(keyed):
    ops = _operations()
    assert len(ops) >= 17
    with httpx.Client(base_url=keyed, timeout=60) as c:
        for method, path in ops:
            body = BODIES.get(path)
            for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": KEY[:-1] + "X"},
                            {"authorization": f"Basic {KEY}"}, {"x-api-key": ""}):
                r = c.request(method, path, json=body, headers=headers)
                if path in access_mod.OPEN_PATHS:  # /health, the dashboard's page and scripts (no data)
                    assert r.status_code == 200
                    continue
                if method == "HEAD":
                    assert r.status_code == 401
                    continue
                message = assert_error_shape(r, path, 401)
                assert KEY not in r.text and "wrong" not in message
                assert r.headers["www-authenticate"].startswith("Bearer")
        # with the key (both headers, scheme in any case) nothing answers 401; the cheap
        # endpoints answer 200
        for headers in ({"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}, {"Authorization": f"bearer {KEY}"}):
            for path in ("/v1/models", "/metrics", "/openapi.json", "/", "/v1/models/x", "/v1/messages/count_tokens"):
                method = "POST" if "count_tokens" in path else "GET"
                r = c.request(method, path, json=BODIES.get(path), headers=headers)
                assert r.status_code == 200, (path, headers, r.text[:200])
            r = c.get("/v1/responses/resp_missing", headers=headers)
            assert_error_shape(r, "/v1/responses/x", 404)


def test_the_official_sdks_authenticate_with_either_header(keyed):
    oa = openai.OpenAI(base_url=f"{keyed}/v1", api_key=KEY, max_retries=0, timeout=120)
    assert oa.chat.completions.create(**CHAT).usage.completion_tokens == 1
    with pytest.raises(openai.AuthenticationError) as err:
        openai.OpenAI(base_url=f"{keyed}/v1", api_key="nope", max_retries=0).models.list()
    assert "API key" in str(err.value)
    # the Anthropic SDK sends x-api-key with api_key, Authorization: Bearer with auth_token
    for client in (anthropic.Anthropic(base_url=keyed, api_key=KEY, max_retries=0, timeout=120),
                   anthropic.Anthropic(base_url=keyed, auth_token=KEY, max_retries=0, timeout=120)):
        assert client.messages.count_tokens(model="m", messages=MESSAGES["messages"]).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=keyed, api_key="nope", max_retries=0).messages.create(**MESSAGES)
    msg = anthropic.Anthropic(base_url=keyed, api_key=KEY, max_retries=0, timeout=120).messages.create(**MESSAGES)
    assert msg.usage.output_tokens == 1


def test_the_key_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = access_mod.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(access_mod.hmac, "compare_digest", spy)
    cfg = AccessConfig.build(KEY)
    assert cfg.key_ok({"authorization": f"Bearer {KEY}"}) and cfg.key_ok({"x-api-key": KEY})
    assert not cfg.key_ok({"authorization": "Bearer " + KEY[:5]}) and not cfg.key_ok({})
    # both headers offered: both compared (which one matched does not show in the timing)
    assert cfg.key_ok({"authorization": "Bearer no", "x-api-key": KEY})
    assert len(calls) == 5 and all(b == KEY.encode() for _, b in calls)


def test_key_from_the_environment_and_bad_values():
    assert access_config(None, [], "127.0.0.1", environ={"JUMPAHEAD_API_KEY": "k1"}).api_key == "k1"
    assert access_config("k2", [], "127.0.0.1", environ={"JUMPAHEAD_API_KEY": "k1"}).api_key == "k2"
    assert access_config(None, [], "127.0.0.1", environ={}).api_key is None
    with pytest.raises(ValueError, match="empty"):
        access_config("  ", [], "127.0.0.1", environ={})
    for bad in ("ftp://x", "localhost:3000", "http://x/path", "null", "http://user@x"):
        with pytest.raises(ValueError, match="origin"):
            normalize_origin(bad)
    assert normalize_origin("HTTP://LocalHost:80/") == "http://localhost"
    assert normalize_origin("https://[::1]:8443") == "https://[::1]:8443"


# --- keys never in logs or traces ---------------------------------------------------------


def test_keys_reach_no_log_and_no_trace(engine, tmp_path, caplog):
    from jumpahead.traces.recorder import TraceRecorder

    wrong = "sk-wrong-key-that-is-also-secret-42"
    trace_dir = tmp_path / "traces"
    recorder = TraceRecorder(trace_dir, tokenizer=engine.tokenizer, model="m")
    caplog.set_level(logging.DEBUG)
    with serve(engine, hooks=[recorder], access=AccessConfig.build(KEY)) as url, httpx.Client(timeout=120) as c:
        for headers in ({"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY},
                        {"authorization": f"Bearer {wrong}"}, {"x-api-key": wrong}):
            r1 = c.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers)
            r2 = c.post(f"{url}/v1/messages", json={**MESSAGES, "metadata": {"api_key": KEY}}, headers=headers)
            assert {r1.status_code, r2.status_code} <= {200, 401}
            for r in (r1, r2):
                assert KEY not in r.text and wrong not in r.text
        assert KEY not in c.get(f"{url}/metrics", headers={"x-api-key": KEY}).text
        assert KEY not in c.get(f"{url}/health").text
    recorder.close()
    files = list(trace_dir.glob("*.jsonl"))
    assert files, "the turns were recorded"
    text = "\n".join(f.read_text() for f in files)
    assert text.count('"<redacted>"') >= 4  # the headers (and the body's api_key) are there, redacted
    assert KEY not in text and wrong not in text
    logged = "\n".join(f"{r.getMessage()} {r.args}" for r in caplog.records)
    assert "refused (401)" in logged  # the refusals are logged ...
    assert KEY not in logged and wrong not in logged  # ... without the key


# --- browsers: Origin, CORS, Host ---------------------------------------------------------


def test_browser_origins_are_refused_unless_allowed(keyed, open_server):
    auth = {"x-api-key": KEY}
    with httpx.Client(timeout=120) as c:
        for url, headers in ((open_server, {}), (keyed, auth)):
            for origin in ("http://evil.example", "null", "http://localhost:5174", "https://localhost:5173"):
                for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)):
                    r = c.post(url + path, json=body, headers={**headers, "origin": origin})
                    assert "forbid" not in assert_error_shape(r, path, 403)
                    assert "access-control-allow-origin" not in r.headers
            # a cross-site request without Origin (old browsers, no-cors) is refused too
            r = c.get(url + "/v1/models", headers={**headers, "sec-fetch-site": "cross-site"})
            assert_error_shape(r, "/v1/models", 403)
            # a preflight from a page that is not allowed gets no CORS grant
            r = c.options(url + "/v1/messages", headers={"origin": "http://evil.example",
                                                         "access-control-request-method": "POST"})
            assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        # no permissive CORS by default: a plain client gets no CORS headers
        r = c.get(open_server + "/v1/models")
        assert r.status_code == 200 and not any(h.startswith("access-control") for h in r.headers)
        # the named web UI: preflight without a key, then the real request with one
        r = c.options(keyed + "/v1/messages", headers={"origin": UI, "access-control-request-method": "POST",
                                                       "access-control-request-headers": "x-api-key,content-type"})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == UI
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "x-api-key" in r.headers["access-control-allow-headers"].lower()
        r = c.post(keyed + "/v1/messages", json=MESSAGES, headers={**auth, "origin": UI})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == UI
        r = c.post(keyed + "/v1/messages", json=MESSAGES, headers={"origin": UI})  # no key: 401 the page can read
        assert_error_shape(r, "/v1/messages", 401)
        assert r.headers["access-control-allow-origin"] == UI


def test_dns_rebinding_host_is_refused(keyed, open_server):
    port = int(open_server.rsplit(":", 1)[1])
    with httpx.Client(timeout=120) as c:
        for url, headers in ((open_server, {}), (keyed, {"x-api-key": KEY})):
            for host in ("evil.example", f"evil.example:{port}", "attacker.localhost.evil.com", "10.0.0.1:8000"):
                for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES), ("/v1/models", None)):
                    r = c.request("POST" if body else "GET", url + path, json=body, headers={**headers, "host": host})
                    assert host_name(host) in assert_error_shape(r, path, 403)
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"app.localhost:{port}"):
                r = c.get(url + "/v1/models", headers={**headers, "host": host})
                assert r.status_code == 200, (host, r.text)
        # /health too: a rebinding page must not even learn what runs here
        assert c.get(open_server + "/health", headers={"host": "evil.example"}).status_code == 403


def test_host_check_follows_the_bind_address():
    assert not AccessConfig.build(bind_host="127.0.0.1").host_allowed("evil.example")
    assert AccessConfig.build(bind_host="myhost.lan").host_allowed("MyHost.lan:8000")
    assert not AccessConfig.build(bind_host="myhost.lan").host_allowed("evil.example")
    assert AccessConfig.build(bind_host="192.168.1.5").host_allowed("192.168.1.5:8000")
    # a wildcard bind answers to names it cannot know: the Host is not checked (use --api-key)
    assert AccessConfig.build(bind_host="0.0.0.0").host_allowed("evil.example")
    assert AccessConfig.build(bind_host="::").host_allowed("evil.example")


# --- request-body limit ---------------------------------------------------------------------


def _raw_post(url: str, path: str, head: dict[str, str], chunks: list[bytes]) -> tuple[int, bytes]:
    """A hand-written HTTP/1.1 request (chunked when no content-length is given)."""
    host, port = url.removeprefix("http://").split(":")
    chunked = "content-length" not in head
    lines = [f"POST {path} HTTP/1.1", f"host: {host}:{port}", "content-type: application/json",
             *(f"{k}: {v}" for k, v in head.items())]
    if chunked:
        lines.append("transfer-encoding: chunked")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            for chunk in chunks:
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the body ended: that is the point
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            part = s.recv(65536)
            if not part:
                break
            data += part
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_bodies_over_the_limit_get_413_declared_or_chunked(keyed):
    import orjson

    limit = 64 * 1024
    auth = {"x-api-key": KEY}
    with httpx.Client(base_url=keyed, timeout=120) as c:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * (limit + 1)}]}
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/messages/count_tokens"):
            r = c.post(path, json=big, headers=auth)
            assert str(limit) in assert_error_shape(r, path, 413)
        # chunked: no length known up front; counted while it streams in
        for path in ("/v1/chat/completions", "/v1/messages"):
            status, body = _raw_post(keyed, path, auth, [b"x" * 8192] * 40)
            assert status == 413 and str(limit).encode() in body
        # a lying Content-Length under the limit with a longer body is cut by the server (h11)
        # a body of exactly the limit is read and judged on its content
        exact = orjson.dumps({**CHAT, "pad": ""})
        exact = orjson.dumps({**CHAT, "pad": "p" * (limit - len(exact))})
        assert len(exact) == limit
        r = c.post("/v1/chat/completions", content=exact, headers={**auth, "content-type": "application/json"})
        assert r.status_code == 200, r.text[:300]
        status, body = _raw_post(keyed, "/v1/chat/completions", auth, [exact[:1000], exact[1000:]])
        assert status == 200, body[:300]
        # the limit did not hurt the server: the next request is served
        assert c.post("/v1/messages", json=MESSAGES, headers=auth).status_code == 200


def test_default_limit_admits_a_claude_code_sized_body(open_server):
    # Claude Code sends 100-400 KB; the default limit (32 MiB) must never bite those
    r = httpx.post(open_server + "/v1/messages/count_tokens", timeout=120,
                   json={"model": "m", "messages": [{"role": "user", "content": "word " * 80_000}]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 10_000


# --- the real CLI -----------------------------------------------------------------------------


def test_serve_refuses_bad_access_flags_without_traceback():
    for args, needle in ((["--allow-origin", "ftp://x"], "not an origin"), (["--api-key", " "], "API key is empty"),
                         (["--max-body-bytes", "0"], "max-body-bytes")):
        out = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "serve", *args],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow
def test_serve_with_key_from_the_environment_logs_no_key(tmp_path):
    port = free_port()
    trace_dir = tmp_path / "traces"
    proc = cli_process(["serve", "--port", str(port), "--max-batch", "2", "--log-level", "debug",
                        "--trace-dir", str(trace_dir), "--allow-origin", UI], env={"JUMPAHEAD_API_KEY": KEY})
    base = f"http://127.0.0.1:{port}"
    try:
        health = wait_health(proc, base, timeout=240)
        assert health.status_code == 200
        assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 401
        assert httpx.get(f"{base}/v1/models", headers={"host": "evil.example", "x-api-key": KEY}).status_code == 403
        r = httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"}, timeout=120)
        assert r.status_code == 200, r.text
        r = httpx.options(f"{base}/v1/messages", headers={"origin": UI, "access-control-request-method": "POST"})
        assert r.headers.get("access-control-allow-origin") == UI
    finally:
        code = interrupt(proc, timeout=30)
    log = proc.stdout.read()
    assert code == 0, log
    assert "refused (401)" in log and KEY not in log
    traces = "".join(p.read_text() for p in Path(trace_dir).glob("*.jsonl"))
    assert traces and KEY not in traces
