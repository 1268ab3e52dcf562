"""The live task world: tasks and their checks, the sandbox, training trajectories
(rendered as the server renders them, tool calls read back by the server's parser),
and a tiny LoRA training run whose adapter the server loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jumpahead.live.sandbox import TOOL_NAMES, TOOLS, run_tool, workspace
from jumpahead.live.trajectories import VARIANTS, applicable, build, generate, training_record
from jumpahead.training.train import LONG_MAX_SEQ
from jumpahead.live.world import KINDS, LONG_KINDS, SINGLE_STEP, make_task, split_seeds

SEEDS = range(12)


# --- world ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_ideal_solution_passes_and_noop_fails(kind):
    for seed in SEEDS:
        task = make_task(seed, kind)
        assert task.kind == kind and task.seed == seed and task.steps == len(task.ideal)
        with workspace() as ws:
            task.setup(ws)
            assert not task.check(ws, ""), f"{kind} seed {seed}: a no-op passes"
            for name, args in task.ideal:
                result = run_tool(ws, name, args)
                assert not result.startswith("Error"), (kind, seed, name, result)
            assert task.check(ws, task.answer), f"{kind} seed {seed}: the ideal solution fails"
            if kind == "run_command":
                assert not task.check(ws, "It printed nothing."), "run_command must see the output reported"


def test_tasks_deterministic_and_kinds_cycle():
    a, b = make_task(123), make_task(123)
    assert (a.kind, a.prompt, a.files, a.ideal) == (b.kind, b.prompt, b.files, b.ideal)
    assert [make_task(s).kind for s in range(len(KINDS))] == list(KINDS)
    assert set(SINGLE_STEP) <= set(KINDS)
    assert all(make_task(s, k).steps == 1 for k in SINGLE_STEP for s in range(3))
    with pytest.raises(ValueError):
        make_task(0, "no_such_kind")


def test_train_and_heldout_seeds_are_disjoint():
    train, held = split_seeds("train", 5000), split_seeds("heldout", 5000)
    assert len(set(train)) == 5000 and not set(train) & set(held)
    assert split_seeds("heldout", 3) == held[:3]
    with pytest.raises(ValueError):
        split_seeds("test", 3)
    def key(seed):  # a task is its prompt and its starting files
        task = make_task(seed)
        return task.prompt, tuple(sorted(task.files.items()))

    assert not {key(s) for s in held[:400]} & {key(s) for s in train[:400]}


# --- sandbox ----------------------------------------------------------------------------


def test_tools_are_openai_function_tools():
    assert TOOL_NAMES == ("read_file", "write_file", "edit_file", "bash")
    for tool in TOOLS:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) == set(params["properties"])


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.txt", "a/../../outside.txt", "~/x", ""])
def test_paths_outside_the_workspace_are_refused(path):
    with workspace() as ws:
        for name, args in (("read_file", {"path": path}), ("write_file", {"path": path, "content": "x"}),
                           ("edit_file", {"path": path, "old": "a", "new": "b"})):
            result = run_tool(ws, name, args)
            assert result.startswith("Error:"), (name, path, result)
        assert not (ws.parent / "outside.txt").exists()


def test_symlink_out_of_the_workspace_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    with workspace() as ws:
        (ws / "link").symlink_to(tmp_path)
        assert run_tool(ws, "read_file", {"path": "link/secret.txt"}).startswith("Error:")


def test_tool_errors_are_results_not_exceptions():
    with workspace() as ws:
        assert run_tool(ws, "rm_rf", {}).startswith("Error: unknown tool")
        assert run_tool(ws, "read_file", {}).startswith("Error:")
        assert run_tool(ws, "read_file", {"path": "missing.txt"}).startswith("Error:")
        assert run_tool(ws, "write_file", {"path": "a.txt"}).startswith("Error:")
        assert run_tool(ws, "write_file", {"path": "a.txt", "content": "one two\n"}) == (
            "The file a.txt has been created (1 line). Here's the result of running `cat -n` on a snippet "
            "of a.txt:\n     1\tone two")
        assert run_tool(ws, "edit_file", {"path": "a.txt", "old": "three", "new": "x"}) == \
            "Error: old text not found in a.txt"
        assert run_tool(ws, "edit_file", {"path": "a.txt", "old": "two", "new": "2"}).startswith(
            "The file a.txt has been updated.")
        assert run_tool(ws, "read_file", {"path": "a.txt"}) == "one 2\n"
        assert run_tool(ws, "bash", "ls").startswith("Error:")
        assert run_tool(ws, "bash", {"command": "exit 3"}).endswith("(exit code 3)")


def test_bash_runs_in_the_workspace_without_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    with workspace() as ws:
        (ws / "f.txt").write_text("hi\n")
        assert run_tool(ws, "bash", {"command": "cat f.txt"}) == "hi\n"
        # it runs in the workspace, whose temporary path the result writes as "." (the same
        # command gives the same result in every run)
        assert run_tool(ws, "bash", {"command": "pwd"}).strip() == "."
        assert run_tool(ws, "bash", {"command": "cat nope.txt"}) == \
            "cat: nope.txt: No such file or directory\n\n(exit code 1)"
        env = run_tool(ws, "bash", {"command": "env"})
        assert "sk-should-not-leak" not in env and "OPENAI_API_KEY" not in env


def test_bash_times_out(monkeypatch):
    import jumpahead.live.sandbox as sandbox

    with workspace() as ws:
        monkeypatch.setitem(sandbox._HANDLERS, "bash", lambda w, a: sandbox._bash(w, a, timeout=0.3))
        result = run_tool(ws, "bash", {"command": "sleep 5"})
        assert result.startswith("Error: command timed out")


def test_bash_has_no_network_where_namespaces_work():
    import jumpahead.live.sandbox as sandbox

    if not sandbox.network_isolated():
        pytest.skip("no unprivileged network namespace here")
    with workspace() as ws:
        out = run_tool(ws, "bash", {"command": "python3 -c 'import socket; "
                                               "socket.create_connection((\"1.1.1.1\", 80), timeout=2)'"})
        assert "(exit code" in out


# --- trajectories -----------------------------------------------------------------------


def test_every_variant_builds_and_passes_the_check():
    seen = set()
    for seed in range(40):
        task = make_task(seed)
        for variant in applicable(task):
            traj = build(task, variant, seed)  # raises when the finished workspace fails the check
            seen.add(variant)
            msgs = traj["messages"]
            assert msgs[0]["role"] == "system" and msgs[1] == {"role": "user", "content": task.prompt}
            assert msgs[-1]["role"] == "assistant" and "tool_calls" not in msgs[-1]
            calls = [m for m in msgs if m.get("tool_calls")]
            assert len(calls) >= task.steps
            if variant == "clean":
                assert len(calls) == task.steps and not traj["mistakes"]
            elif variant != "verify":
                assert traj["mistakes"], variant
                results = [m["content"] for m in msgs if m["role"] == "tool"]
                if variant in ("edit_miss", "bad_command"):
                    assert any("not found" in r or "No such file" in r for r in results)
    assert seen == set(VARIANTS) - {"skip_edit"}  # skip_edit: long kinds only (tests/test_live_long.py)


def test_generate_mixes_recoveries():
    trajs = generate(split_seeds("train", 80))
    variants = [t["variant"] for t in trajs]
    assert variants.count("clean") > len(variants) // 2
    assert len(set(variants)) >= 4


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from jumpahead.engine.model.default_model import ensure_default_model

    return load_tokenizer(ensure_default_model(progress=lambda s: None))


def _sample_trajectories() -> list[dict]:
    out = []
    for seed in range(16):
        task = make_task(seed)
        for variant in applicable(task):
            out.append(build(task, variant, seed))
    return out


def _long_trajectories() -> list[dict]:
    """One of each long kind (a plan, drafts, a missed edit repaired): 14-27 calls."""
    return [build(make_task(5, kind), variant, 5) for kind in LONG_KINDS for variant in ("clean", "skip_edit")]


def test_training_text_is_what_the_server_renders(tokenizer):
    """At each assistant turn, the trainer's prompt (mlx-lm's apply_chat_template of the
    record) equals the server's prompt for the same conversation sent over the OpenAI
    protocol (core/prompt.py): training and serving see the same tokens."""
    from jumpahead.training.train import _ids
    from jumpahead.proxy.openai_chat import parse_chat_request
    from jumpahead.core.prompt import render_prompt

    for traj in _sample_trajectories()[::3] + _long_trajectories()[::2]:
        record = json.loads(json.dumps(training_record(traj)))  # as read back from the JSONL
        msgs, tools = record["messages"], record["tools"]
        full = _ids(tokenizer, msgs, tools)
        assert len(full) <= (LONG_MAX_SEQ if traj["kind"] in LONG_KINDS else 1024)
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            server = render_prompt(tokenizer, parse_chat_request({"model": "m", "messages": msgs[:i], "tools": tools}))
            trainer = _ids(tokenizer, msgs[:i], tools, add_generation_prompt=True)
            assert server == trainer
            assert full[: len(server)] == server


def test_assistant_turns_parse_back_to_the_same_calls(tokenizer):
    """The text the model learns to write for each assistant turn, fed to the server's
    output parser, gives back the message's text and tool calls."""
    from jumpahead.training.train import _ids
    from jumpahead.proxy.openai_chat import parse_chat_request
    from jumpahead.core.output_parser import OutputParser
    from jumpahead.core.turn import ContentDelta

    for traj in _sample_trajectories()[::2] + _long_trajectories()[1::2]:
        msgs, tools = traj["messages"], traj["tools"]
        turn_tools = parse_chat_request({"model": "m", "messages": msgs[:2], "tools": tools}).tools
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            start = len(_ids(tokenizer, msgs[:i], tools, add_generation_prompt=True))
            end = len(_ids(tokenizer, msgs[: i + 1], tools))
            text = tokenizer.decode(_ids(tokenizer, msgs[: i + 1], tools)[start:end])
            assert text.endswith("<|im_end|>\n")
            parser = OutputParser.for_tokenizer(tokenizer, turn_tools)
            events = parser.feed(text.removesuffix("<|im_end|>\n")) + parser.finish()
            content = "".join(e.text for e in events if isinstance(e, ContentDelta))
            assert content == m["content"]
            want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls", [])]
            got = [(c.name, json.loads(c.arguments)) for c in parser.tool_calls]
            assert got == want and not parser.malformed
            assert all(not c.issues for c in parser.tool_calls)


def test_loss_mask_covers_assistant_turns_only(tokenizer):
    from jumpahead.training.train import tokens_and_mask

    traj = build(make_task(3, "replace_line"), "edit_miss", 3)
    record = training_record(traj)
    assert record["no_loss"] == traj["mistakes"] and record["no_loss"]
    ids, mask = tokens_and_mask(tokenizer, record)
    learned = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "<tool_response>" not in learned and "# Tools" not in learned
    assert "I read" in learned and "has been updated" not in learned
    mistake = msgs_call_args(traj["messages"][record["no_loss"][0]])
    correct = msgs_call_args(traj["messages"][-3])
    assert json.dumps(mistake["old"]) not in learned and json.dumps(correct["old"]) in learned
    assert learned.count("<|im_end|>") == sum(m["role"] == "assistant" for m in traj["messages"]) - 1


def msgs_call_args(message: dict) -> dict:
    return json.loads(message["tool_calls"][0]["function"]["arguments"])


def test_cli_knows_the_commands():
    from jumpahead.app.cli import COMMANDS, build_parser

    assert "train-adapter" in COMMANDS and "eval-adapter" in COMMANDS
    args = build_parser("train-adapter").parse_args(["train-adapter", "--iters", "3", "--out", "x"])
    assert args.iters == 3 and args.out == "x"
    args = build_parser("serve").parse_args(["serve", "--adapter", "smol-agent"])
    assert args.adapter == "smol-agent"


def test_eval_adapter_lists_heldout_seeds(capsys):
    from jumpahead.app.cli import main

    assert main(["eval-adapter", "--n", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seeds"] == split_seeds("heldout", 5)


def test_unknown_adapter_is_refused():
    from jumpahead.engine.model.lora import resolve_adapter

    with pytest.raises(FileNotFoundError):
        resolve_adapter("/nonexistent/adapter")


# --- training ---------------------------------------------------------------------------


def test_tiny_training_run_gives_an_adapter_the_server_loads(tmp_path, tiny_model_dir):
    """2 iterations on a tiny slice: mlx-lm adapter files, loaded and fused by the engine
    (the cache identity includes the adapter), /health reports it, and the adapted model
    answers a chat request. The base is conftest.py's tiny random-weight llama (--model):
    the plumbing is the point, not what the adapter learns, and the default model's
    forward and backward over 640-token rows made this ~20 s on 2 cores."""
    import argparse

    import httpx

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.training.train import add_arguments, train_adapter

    from .serving import serve

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "adapter"
    args = parser.parse_args(["--iters", "2", "--n-train", "4", "--n-valid", "0", "--batch-size", "1",
                              "--num-layers", "2", "--max-seq-length", "640", "--model", str(tiny_model_dir),
                              "--out", str(out)])
    summary = train_adapter(args, progress=lambda s: None)
    assert (out / "adapters.safetensors").stat().st_size > 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "lora" and config["num_layers"] == 2
    assert summary["tokens_per_s"] > 0 and summary["iterations_per_s"] > 0
    assert not list(out.glob("0*_adapters.safetensors"))

    engine = Engine.load(str(tiny_model_dir), EngineConfig(max_batch=1, prefix_cache_dir=str(tmp_path / "cache")),
                         progress=lambda s: None, adapter=str(out))
    try:
        assert engine.info.adapter == str(out) and engine.info.adapter_digest
        assert "+adapter-" in engine.info.cache_name
        task = make_task(0, "create_file")
        with serve(engine) as url:
            health = httpx.get(f"{url}/health", timeout=30).json()
            assert health["adapter"]["digest"] == engine.info.adapter_digest
            from jumpahead.live.sandbox import SYSTEM_PROMPT

            body = {"model": "m", "max_tokens": 8, "temperature": 0, "tools": TOOLS,
                    "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                                 {"role": "user", "content": task.prompt}]}
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["role"] == "assistant"
    finally:
        engine.close()


def test_shipped_adapter_when_present():
    from jumpahead.engine.model.lora import SHIPPED_DIR, resolve_adapter

    folder = SHIPPED_DIR / "smol-agent"
    if not (folder / "adapters.safetensors").exists():
        pytest.skip("no shipped adapter yet (jumpahead train-adapter --out engine/weights/adapters/smol-agent)")
    assert resolve_adapter("smol-agent") == folder.resolve()
    assert (folder / "adapters.safetensors").stat().st_size < 16 << 20
    assert os.path.getsize(folder / "adapter_config.json") < 16 << 10


def test_training_resumes_from_an_adapter(tmp_path):
    """--resume-from starts from the adapter's own weights and shape: at learning rate 0
    one step writes them back unchanged (a fresh LoRA init would differ), the config says
    where it came from, and a folder that is no adapter is a CLI error (exit 2)."""
    import argparse

    import mlx.core as mx

    from jumpahead.app.cli import main
    from jumpahead.engine.model.lora import SHIPPED_DIR
    from jumpahead.training.train import add_arguments, train_adapter

    shipped = SHIPPED_DIR / "smol-agent"
    if not (shipped / "adapters.safetensors").exists():
        pytest.skip("no shipped adapter (jumpahead train-adapter --out engine/weights/adapters/smol-agent)")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "resumed"
    args = parser.parse_args(["--iters", "1", "--n-train", "2", "--n-valid", "0", "--batch-size", "1",
                              "--num-layers", "2", "--rank", "4", "--max-seq-length", "640",
                              "--learning-rate", "0", "--resume-from", str(shipped), "--out", str(out)])
    train_adapter(args, progress=lambda s: None)
    config = json.loads((out / "adapter_config.json").read_text())
    prior = json.loads((shipped / "adapter_config.json").read_text())
    assert config["num_layers"] == prior["num_layers"] and config["lora_parameters"] == prior["lora_parameters"]
    assert config["resumed_from"]["path"] == str(shipped) and config["resumed_from"]["iters"] == prior["iters"]
    before, after = mx.load(str(shipped / "adapters.safetensors")), mx.load(str(out / "adapters.safetensors"))
    assert set(before) == set(after)
    assert all(mx.array_equal(before[k], after[k]).item() for k in before)
    assert main(["train-adapter", "--resume-from", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
