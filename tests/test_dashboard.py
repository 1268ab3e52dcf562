"""The live dashboard (`/dashboard`, `/dashboard.json`; proxy/dashboard.py) on the real
server and the default model: what the JSON reports against the answers' own usage,
in-flight turns, policy interventions, the access rules, and the page in a real
headless Chromium (Debian's chromium + chromium-driver, driven by selenium): it loads
with no console errors, fetches nothing from elsewhere and updates when a request
completes. With JUMPAHEAD_DASHBOARD_SCREENSHOT=PATH the page under load is saved there
(the README's docs/dashboard.png)."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from jumpahead.policies.runtime import PolicyHooks
from jumpahead.proxy.access import OPEN_PATHS, AccessConfig
from jumpahead.proxy.dashboard import PAGE_PATHS, STATIC, ordinary_estimate
from jumpahead.proxy.openapi import openapi_document

from .serving import serve

KEY = "sk-dash-0123456789-SECRET"
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
COPY = [{"role": "user", "content": f"Repeat this code exactly:\n```python\n{CODE}```"}]
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]
MASKING = "masking:keep=1,clear_at_least=64"


def _masked_history() -> list[dict[str, Any]]:
    """Three long tool results: the masking policy rewrites the older two (an intervention)."""
    result = "line of a long tool output\n" * 40
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    for k in range(3):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"run {k}\n" + result})
    messages.append({"role": "user", "content": "Say ok."})
    return messages


@pytest.fixture(scope="module")
def server(engine) -> Iterator[str]:
    hooks = [PolicyHooks([MASKING], engine.tokenizer, engine.context_length)]
    with serve(engine, hooks=hooks) as url:
        yield url


@pytest.fixture(scope="module")
def keyed(engine) -> Iterator[str]:
    with serve(engine, access=AccessConfig.build(KEY)) as url:
        yield url


def _client(url: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=kw.pop("api_key", "x"), max_retries=0, timeout=300, **kw)


def _state(url: str, **headers: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/dashboard.json", headers=headers, timeout=30)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def _wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


# --- /dashboard.json -----------------------------------------------------------------------


def test_a_turn_is_reported_as_the_answer_reports_it(server):
    before = _state(server)
    client = _client(server)
    answers = [client.chat.completions.create(model="m", messages=COPY, max_tokens=24, temperature=0,
                                              extra_headers={"x-session-id": "dash-copy"},
                                              extra_body={"jumpahead": {"methods": ["echo"]}}) for _ in range(2)]
    after = _state(server)
    assert after["seq"] == before["seq"] + 2
    turns = [t for t in after["turns"] if t["session"] == "dash-copy"][-2:]
    assert len(turns) == 2
    for turn, answer in zip(turns, answers):
        usage = answer.usage
        assert turn["prompt_tokens"] == usage.prompt_tokens
        assert turn["completion_tokens"] == usage.completion_tokens
        assert turn["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
        assert turn["by_kind"] == usage.model_extra["fill"]["tokens"]
        assert sum(turn["by_kind"].values()) == usage.completion_tokens
        assert turn["protocol"] == "chat" and turn["finish"] == answer.choices[0].finish_reason
        assert turn["rounds"] >= 1 and turn["decode_s"] > 0
        assert turn["saved_s"] == pytest.approx(turn["ordinary_s"] - turn["decode_s"], abs=1e-3)
        assert turn["ordinary_s"] >= turn["decode_s"]
        assert turn["rounds_saved"] == max(0, usage.completion_tokens - 1 - turn["rounds"])
    assert turns[1]["cached_tokens"] > 0  # the same prompt again: from the prefix cache
    assert turns[1]["by_kind"].get("echo", 0) > 0  # the repeated code is copied from the prompt
    total, was = after["totals"], before["totals"]
    assert total["turns"] == was["turns"] + 2
    assert total["completion_tokens"] == was["completion_tokens"] + sum(a.usage.completion_tokens for a in answers)
    assert total["by_kind"]["echo"] == was["by_kind"].get("echo", 0) + sum(t["by_kind"].get("echo", 0) for t in turns)
    session = next(s for s in after["sessions"] if s["session"] == "dash-copy")
    assert session["turns"] >= 2 and session["in_flight"] == 0
    cache = after["engine"]["prefix_cache"]
    assert cache["hits"] >= before["engine"]["prefix_cache"]["hits"] + 1 and 0 < cache["hit_rate"] <= 1
    queue = after["engine"]["queue"]
    assert queue["max_batch"] == 8 and all(isinstance(queue[k], int) for k in ("rows_running", "rows_waiting"))


def test_a_streaming_turn_is_in_flight_until_it_ends(server):
    client = _client(server)
    count = [{"role": "user", "content": "Count from 1 to 200, one number a line."}]
    stream = client.chat.completions.create(model="m", messages=count, max_tokens=120, temperature=0, stream=True,
                                            extra_headers={"x-session-id": "dash-stream"})
    next(iter(stream))
    state = _state(server)
    flight = [f for f in state["in_flight"] if f["session"] == "dash-stream"]
    assert len(flight) == 1 and flight[0]["prompt_tokens"] > 0 and flight[0]["protocol"] == "chat"
    assert next(s for s in state["sessions"] if s["session"] == "dash-stream")["in_flight"] == 1
    assert state["engine"]["queue"]["rows_running"] + state["engine"]["queue"]["rows_waiting"] >= 1
    stream.close()  # the client goes away: the turn ends as cancelled and leaves the list
    def left() -> dict[str, Any] | None:
        s = _state(server)
        return None if any(f["session"] == "dash-stream" for f in s["in_flight"]) else s

    state = _wait(left, 60, "the closed stream to leave in_flight")
    turn = [t for t in state["turns"] if t["session"] == "dash-stream"][-1]
    # cancelled, unless the row had ended before the server saw the client go
    assert turn["finish"] == "cancelled" or turn["completion_tokens"] == 120, turn


def test_policy_interventions_are_listed(server):
    before = _state(server)
    answer = _client(server).chat.completions.create(model="m", messages=_masked_history(), max_tokens=1,
                                                     extra_headers={"x-session-id": "dash-masked"})
    notes = answer.usage.model_extra["report"]["policies"]["interventions"]
    assert any(n["policy"] == "masking" for n in notes)
    after = _state(server)
    assert after["totals"]["interventions"] == before["totals"]["interventions"] + len(notes)
    turn = [t for t in after["turns"] if t["session"] == "dash-masked"][-1]
    assert turn["interventions"] == len(notes)
    listed = [iv for iv in after["interventions"] if iv["session"] == "dash-masked"]
    assert {iv["policy"] for iv in listed} == {n["policy"] for n in notes}
    masking = next(iv for iv in listed if iv["policy"] == "masking")
    assert masking["tokens_after"] == answer.usage.prompt_tokens < masking["tokens_before"]
    assert after["policies"]["interventions"]["masking"]


def test_ordinary_estimate():
    # 11 tokens in 4 rounds of 0.1 s: ordinary decoding takes 10 rounds after prefill's token
    assert ordinary_estimate(11, 0.4, 4) == pytest.approx(1.0)
    # ... of which 0.1 s went to 10 verified proposal tokens: a plain round is 0.075 s
    assert ordinary_estimate(11, 0.4, 4, verified=10, token_s=0.01) == pytest.approx(0.75)
    assert ordinary_estimate(5, 0.4, 4) == pytest.approx(0.4)  # one token a round: nothing saved
    assert ordinary_estimate(5, 0.4, 4, verified=8, token_s=0.01) == pytest.approx(0.4)  # never below actual
    assert ordinary_estimate(1, 0.0, 0) == 0.0


# --- access ----------------------------------------------------------------------------------


def test_the_page_is_open_and_its_data_needs_the_key(keyed):
    # no key: /health and the page's own files (static, the same for everyone); nothing else
    assert OPEN_PATHS == {"/health", *PAGE_PATHS}
    doc = openapi_document()["paths"]
    assert all(doc[p]["get"]["security"] == [] for p in PAGE_PATHS) and "security" not in doc["/dashboard.json"]["get"]
    with httpx.Client(base_url=keyed, timeout=60) as c:
        page = c.get("/dashboard")
        assert page.status_code == 200 and page.text == (STATIC / "dashboard.html").read_text()
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        for path in ("/dashboard/dashboard.js", "/dashboard/dashboard.css", "/dashboard/plotly.min.js"):
            assert c.get(path).status_code == 200, path
        assert c.get("/dashboard/plotly.min.js").text.startswith("/**\n* plotly.js v")
        for headers in ({}, {"authorization": "Bearer wrong"}):
            r = c.get("/dashboard.json", headers=headers)
            assert r.status_code == 401 and KEY not in r.text
        assert c.get("/dashboard.json", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.get("/dashboard.json", headers={"x-api-key": KEY}).status_code == 200
        # DNS rebinding and other sites' pages are refused, the page too
        for path in ("/dashboard", "/dashboard.json"):
            r = c.get(path, headers={"host": "evil.example", "authorization": f"Bearer {KEY}"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
            r = c.get(path, headers={"origin": "http://evil.example", "authorization": f"Bearer {KEY}"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"


# --- the page in a browser ---------------------------------------------------------------------


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("no chromium / chromedriver installed: the browser tests need Debian's chromium and "
                    "chromium-driver (scripts/install.sh --test installs them with apt on Linux)")
    return browser, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, chromedriver = _chromium()
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extras)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1180", "--hide-scrollbars", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


def _text(driver: Any, element_id: str) -> str:
    return driver.execute_script(f"return document.getElementById({element_id!r}).textContent")


def _polls(driver: Any) -> int:
    return int(driver.execute_script("return document.body.dataset.polls") or 0)


def _open(driver: Any, url: str) -> None:
    driver.get(url)
    driver.get_log("browser")  # what an earlier page logged is not this page's
    _wait(lambda: _polls(driver) >= 1, 120, "the page's first poll")


def _console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]


def _foreign_resources(driver: Any, url: str) -> list[str]:
    names = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return [n for n in names if not n.startswith(url + "/")]


def test_the_page_loads_and_updates_when_a_request_completes(server, browser):
    _open(browser, f"{server}/dashboard")
    assert _text(browser, "status") == "live"
    turns = int(_text(browser, "turns").replace(",", ""))
    assert turns == _state(server)["totals"]["turns"]
    charts = browser.execute_script("return document.querySelectorAll('.chart .main-svg').length")
    assert charts >= 6  # plotly drew every chart
    answer = _client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hi"}],
                                                     max_tokens=8, extra_headers={"x-session-id": "dash-browser"})
    _wait(lambda: _text(browser, "turns").replace(",", "") == str(turns + 1), 60, "the turns tile to count it")
    sessions = _wait(lambda: "dash-browser" in _text(browser, "table-sessions") and _text(browser, "table-sessions"),
                     30, "the session in the sessions table")
    assert str(answer.usage.completion_tokens) in sessions
    assert _console_errors(browser) == []
    assert _foreign_resources(browser, server) == []


def test_the_page_takes_the_key_from_its_fragment(keyed, browser):
    _open(browser, f"{keyed}/dashboard#key={KEY}")
    assert _text(browser, "status") == "live"
    assert browser.execute_script("return location.hash") == ""  # the key left the address bar
    assert browser.execute_script("return document.getElementById('keybox').hidden") is True
    assert _console_errors(browser) == []
    browser.execute_script("sessionStorage.clear()")
    browser.get(f"{keyed}/dashboard")  # no key: the page asks for one
    _wait(lambda: _text(browser, "status") == "API key needed", 60, "the page to ask for the key")
    assert browser.execute_script("return document.getElementById('keybox').hidden") is False


def test_the_page_under_load_shows_provenance(server, browser, tmp_path: Path):
    _open(browser, f"{server}/dashboard")
    client = _client(server)

    def copy(i: int) -> Any:
        return client.chat.completions.create(model="m", messages=COPY, max_tokens=32, temperature=0,
                                              extra_headers={"x-session-id": f"agent-{i}"},
                                              extra_body={"jumpahead": {"methods": ["echo"]}})

    def tool(i: int) -> Any:
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Read setup.py"}],
                                              tools=TOOLS, tool_choice="required", max_tokens=32,
                                              extra_headers={"x-session-id": f"agent-{i}"})

    def masked(i: int) -> Any:
        return client.chat.completions.create(model="m", messages=_masked_history(), max_tokens=4,
                                              extra_headers={"x-session-id": f"agent-{i}"})

    before = _state(server)["seq"]
    shot = tmp_path / "dashboard.png"
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        saw_queue = False
        futures = [pool.submit(work, i) for i in range(3) for work in (copy, tool, masked)]
        while not all(f.done() for f in futures):
            saw_queue = saw_queue or _text(browser, "queue") not in ("0 / 0", "–")
            seq = int(browser.execute_script("return document.body.dataset.seq"))
            if not shot.exists() and seq >= before + 5 and _text(browser, "in-flight") != "0":
                browser.save_screenshot(str(shot))  # mid-load: turns done, others running
            time.sleep(0.3)
        answers = [f.result() for f in futures]
    assert saw_queue, "the queue tile never showed a running row"
    _wait(lambda: int(browser.execute_script("return document.body.dataset.seq")) >= before + len(answers), 60,
          "the page to show the load's turns")
    state = _state(server)
    assert state["totals"]["by_kind"].get("echo", 0) > 0 and state["totals"]["by_kind"].get("strict", 0) > 0
    labels = browser.execute_script(
        "return Array.from(document.querySelectorAll('#chart-provenance .ytick text')).map(e => e.textContent)")
    assert {"sampled", "echo", "strict"} <= set(labels), labels
    assert _text(browser, "supplied") not in ("–", "0.0%")
    assert int(_text(browser, "interventions")) >= 3
    listed = _text(browser, "table-interventions")
    assert "masking" in listed and "prompt " in listed and " → " in listed
    assert _console_errors(browser) == []
    assert _foreign_resources(browser, server) == []
    if not shot.exists():
        assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
    target = os.environ.get("JUMPAHEAD_DASHBOARD_SCREENSHOT")
    if target:
        shutil.copyfile(shot, target)
