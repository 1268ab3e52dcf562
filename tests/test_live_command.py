"""`jumpahead live`: the runner's accounting through real servers, the summary's
arithmetic on made-up records, the live oracle's rendering, and CLI errors."""

from __future__ import annotations

import json

import pytest

from jumpahead.live.agent import ideal_calls
from jumpahead.live.arms import parse_live_arm, parse_live_arms
from jumpahead.traces.arms import ArmError
from jumpahead.live.oracle import render_call
from jumpahead.live.summary import summarize, task_account, wilson
from jumpahead.app.cli import main


def _turn(wall: float, prefill: float, decode: float, rounds: list[list], completion: int, sampled: int,
          propose_ms: float = 0.0, interventions: list | None = None, error: bool = False) -> dict:
    fill = {"tokens": {"sampled": sampled, **({"jump": completion - sampled} if completion > sampled else {})},
            "propose_ms": propose_ms, "policies": {"interventions": interventions or []}}
    return {"wall_s": wall, "completion_tokens": completion, "fill": fill,
            "timings": {"prefill_s": prefill, "decode_s": decode, "rounds": len(rounds),
                        "round_ms": [[prefill * 1000, 1], *rounds]},
            "calls": [{"name": "write_file", "error": error}]}


PLAIN = [[100.0, 1]] * 10  # ten one-token rounds of 0.1 s
JUMPED = [[150.0, 10]]  # one round carrying 10 tokens (9 supplied)


def _rec(arm: str, seed: int, success: bool, wall: float, turns: list[dict]) -> dict:
    return {"arm": arm, "seed": seed, "success": success, "status": "answered" if success else "step_limit",
            "wall_s": wall, "turns": turns}


def test_summary_arithmetic_on_made_up_records() -> None:
    wrong = [{"boundary": "tool_name", "tokens": 10, "label": "mistaken truncated content 20 -> 3 chars | x"}]
    right = [{"boundary": "tool_name", "tokens": 10, "label": "oracle write_file: ..."}]
    records = [
        _rec("ordinary", 1, True, 3.0, [_turn(1.5, 0.2, 1.0, PLAIN, 11, 11), _turn(1.5, 0.1, 1.0, PLAIN, 11, 11)]),
        _rec("ordinary", 2, False, 2.0, [_turn(2.0, 0.2, 1.0, PLAIN, 11, 11)]),
        _rec("j", 1, True, 2.0, [_turn(1.0, 0.2, 0.15, JUMPED, 11, 2, 5.0, right),
                                 _turn(1.0, 0.1, 1.0, PLAIN, 11, 11)]),
        _rec("j", 2, False, 4.0, [_turn(1.0, 0.2, 0.15, JUMPED, 11, 2, 5.0, wrong),
                                  _turn(1.5, 0.1, 1.0, PLAIN, 11, 11), _turn(1.5, 0.1, 1.0, PLAIN, 11, 11)]),
    ]
    s = summarize(records, ["ordinary", "j"])
    assert s["plain_round_s"] == pytest.approx(0.1)
    acc = {a["seed"]: a for a in s["accounts"]["j"]}
    assert acc[1]["D_s"] == pytest.approx(0.9)  # 9 supplied x 0.1
    assert acc[1]["P_s"] == pytest.approx(0.15 - 0.1 - 0.005)  # the carrying round beyond plain, less proposing
    assert acc[1]["H_s"] == pytest.approx(0.005)
    # seed 1: ordinary 1.2 + 1.1 s, the arm 0.35 + 1.1 s: the measured saving (0.85 s) is
    # exactly D - P - H, so nothing is left for R
    assert acc[1]["tts_s"] == pytest.approx(1.45) and acc[1]["saved_s"] == pytest.approx(0.85)
    assert acc[1]["R_s"] == pytest.approx(0.0, abs=1e-6)
    # seed 2: neither arm solves it within the budget: no time to success, no R, out of the pairs
    assert acc[2]["tts_s"] is None and acc[2]["R_s"] is None and acc[2]["net_s"] is None
    j = s["per_arm"]["j"]
    assert j["unsolved_pairs"] == 1 and j["totals"]["tasks"] == 1
    assert j["totals"]["net_s"] == pytest.approx(j["totals"]["D_s"] - j["totals"]["P_s"] - j["totals"]["H_s"]
                                                 - j["totals"]["R_s"], abs=1e-5)
    assert j["totals"]["net_s"] == pytest.approx(j["tts_s_saved_per_task"]["mean"], abs=1e-5)  # net is the measured saving
    assert j["recovery"] == {**j["recovery"], "jump_interventions": 2, "wrong": 1, "wrong_rate": 0.5,
                             "tasks_with_wrong": 1, "recovered_tasks": 0, "unrecovered_tasks": 1}
    assert j["wall_s_all"]["total"] == pytest.approx(6.0)
    # no wall-time figure over successes only, nor a wall-time saving pairing failures (issue 40)
    assert "wall_s_success" not in j and "wall_s_saved_per_task" not in j
    for key in ("net_s_per_task", "R_s_per_task"):
        ci = j[key]
        assert ci["lo"] <= ci["mean"] <= ci["hi"], key
    assert s["per_arm"]["ordinary"]["totals"]["D_s"] == 0 and s["per_arm"]["ordinary"]["totals"]["R_s"] == 0


def test_rejected_rounds_are_priced_not_left_in_r() -> None:
    """An exact arm whose proposals were all rejected in some rounds: those rounds' extra
    forward time is P (the trace's third `round_ms` field says they carried proposal
    tokens), so R stays 0; read without the field, the same cost lands in R. A failed
    proposal never counts as a saving: D counts only accepted tokens."""
    # one round carried 10 tokens (9 accepted), two carried 4 proposal tokens each and
    # emitted one (all rejected, 0.13 s instead of 0.1), then seven plain rounds: 20 tokens
    rounds = [[150.0, 10, 9], [130.0, 1, 4], [130.0, 1, 4], *[[100.0, 1, 0]] * 7]
    arm_decode = 0.15 + 0.26 + 0.7
    records = [
        _rec("ordinary", 1, True, 3.0, [_turn(2.0, 0.2, 1.9, [[100.0, 1]] * 19, 20, 20)]),
        _rec("e", 1, True, 2.0, [_turn(1.5, 0.2, arm_decode, rounds, 20, 11)]),
    ]
    s = summarize(records, ["ordinary", "e"])
    acc = s["accounts"]["e"][0]
    assert s["rejected_rounds_priced"] is False  # the ordinary arm's made-up trace has no third field
    assert acc["D_s"] == pytest.approx(0.9)  # 9 accepted x 0.1; the 8 rejected count nothing
    assert acc["P_s"] == pytest.approx(0.05 + 0.03 + 0.03)  # the carrying round and both rejected rounds
    assert acc["saved_s"] == pytest.approx(1.9 - arm_decode)
    assert acc["R_s"] == pytest.approx(0.0, abs=1e-6)
    # the same trace without the field (older traces): the rejected rounds look plain, their cost is R
    old = [[ms, n] for ms, n, _ in rounds]
    records[1] = _rec("e", 1, True, 2.0, [_turn(1.5, 0.2, arm_decode, old, 20, 11)])
    acc = summarize(records, ["ordinary", "e"])["accounts"]["e"][0]
    assert acc["P_s"] == pytest.approx(0.05) and acc["R_s"] == pytest.approx(0.06)


def test_an_unrecovered_wrong_jump_is_charged_the_redo() -> None:
    """A wrong jump that makes a task fail, where the ordinary arm solved it, costs the
    redo (ordinary's model time on the seed): failing fast must not read as a saving."""
    wrong = [{"boundary": "tool_name", "tokens": 10, "label": "mistaken truncated content 20 -> 3 chars | x"}]
    records = [
        _rec("ordinary", 1, True, 3.0, [_turn(1.5, 0.2, 1.0, PLAIN, 11, 11), _turn(1.5, 0.1, 1.0, PLAIN, 11, 11)]),
        _rec("j", 1, False, 1.0, [_turn(1.0, 0.2, 0.15, JUMPED, 11, 2, 5.0, wrong)]),
    ]
    s = summarize(records, ["ordinary", "j"])
    acc = s["accounts"]["j"][0]
    # time to success: the failed attempt (0.35 s) and the ordinary redo (2.3 s)
    assert acc["unrecovered"] and acc["tts_s"] == pytest.approx(0.35 + 2.3)
    # the wrong jump's tokens avoid no decoding (D = 0); P and H of its round stay:
    # R = (0 - 0.045 - 0.005) less the (negative) measured saving -0.35
    assert acc["D_s"] == 0 and acc["R_s"] == pytest.approx(-0.05 + 0.35)
    assert acc["net_s"] == pytest.approx(-0.35) and acc["net_s"] < 0
    assert s["per_arm"]["j"]["recovery"]["unrecovered_tasks"] == 1


@pytest.mark.parametrize("arm_s", [0.01, 0.35, 5.0])
def test_a_fast_failure_never_lowers_time_to_success(arm_s: float) -> None:
    """However fast an attempt fails, its time to success is above the ordinary arm's."""
    fast = _turn(arm_s, arm_s / 2, arm_s / 2, [[arm_s * 500, 1]], 1, 1)
    records = [_rec("ordinary", 1, True, 3.0, [_turn(1.5, 0.2, 1.0, PLAIN, 11, 11)]),
               _rec("e", 1, False, arm_s, [fast])]  # an arm without any jump (echo, compaction, ...)
    acc = summarize(records, ["ordinary", "e"])["accounts"]["e"][0]
    assert acc["tts_s"] > 1.2 and acc["saved_s"] < 0
    assert acc["R_s"] == pytest.approx(-acc["saved_s"] + acc["D_s"] - acc["P_s"] - acc["H_s"])
    assert acc["R_s"] > 0  # a failure costs even where no jump was detected wrong


def test_a_wrong_jump_whose_later_turns_are_fast_pays_its_true_cost() -> None:
    """The wrong jump costs one extra plain turn (1.2 s); the arm's later turn is fast by
    its own right jump. R must be that extra turn, not shrunk by the later jump's gain
    (charging "later turns minus ordinary's later turns" would give 0.35 s)."""
    wrong = [{"boundary": "tool_name", "tokens": 10, "label": "mistaken truncated content 20 -> 3 chars | x"}]
    right = [{"boundary": "tool_name", "tokens": 10, "label": "oracle write_file: ..."}]
    plain = [_turn(1.5, 0.2, 1.0, PLAIN, 11, 11), _turn(1.5, 0.2, 1.0, PLAIN, 11, 11)]
    records = [_rec("ordinary", 1, True, 3.0, plain),
               _rec("j", 1, True, 3.0, [_turn(1.0, 0.2, 0.15, JUMPED, 11, 2, 5.0, wrong),
                                        _turn(1.5, 0.2, 1.0, PLAIN, 11, 11),  # the redo of the wrong write
                                        _turn(1.0, 0.2, 0.15, JUMPED, 11, 2, 5.0, right)])]
    acc = summarize(records, ["ordinary", "j"])["accounts"]["j"][0]
    assert acc["wrong"] == 1 and acc["saved_s"] == pytest.approx(2.4 - 1.9)
    # D credits the right jump only (0.9 s): the extra turn (1.2 s) less the 0.9 s the wrong
    # jump's tokens are no longer credited with
    assert acc["D_s"] == pytest.approx(0.9) and acc["R_s"] == pytest.approx(1.2 - 0.9)
    assert acc["net_s"] == pytest.approx(acc["saved_s"])


def test_replay_and_live_price_interventions_with_the_same_code() -> None:
    """One round carrying 10 tokens (9 supplied) of 0.15 s with 5 ms of proposing, plain
    rounds of 0.1 s: replay's intervention and live's turn come out the same."""
    from jumpahead.traces import accounting, replay
    from jumpahead.live import summary

    assert replay.price is accounting.price and summary.price is accounting.price
    arm = replay.ArmTurn(prefill_s=0.2, decode_s=0.15, cached_tokens=0, prompt_tokens=10,
                         tokens_by_kind={"sampled": 2, "jump": 9}, rounds=2, verified={}, propose_s=0.005,
                         policy_s=0.0, identical=True, diverged=False, output=list(range(11)),
                         kinds=["sampled"] + ["jump"] * 9 + ["sampled"], round_sizes=[1, 10],
                         round_s=[0.0, 0.15], round_propose_s=[0.0, 0.005])
    (item,) = replay.interventions(arm, 0.1)
    live = summary.turn_account(_turn(1.0, 0.2, 0.15, JUMPED, 11, 2, 5.0), 0.1)
    assert (item["D_s"], item["P_s"], item["H_s"]) == pytest.approx((live["D_s"], live["P_s"], live["H_s"]))
    assert (item["D_s"], item["P_s"], item["H_s"]) == pytest.approx((0.9, 0.045, 0.005))


def test_wilson_bounds() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(8, 10)
    assert 0.49 < lo < 0.8 < hi < 0.95
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 10)[0] == 0.0


def test_live_oracle_renders_in_the_models_layout() -> None:
    end = "</tool_call>"
    args = {"path": "a.txt", "content": "x y\n"}
    full = '\n{"name": "write_file", "arguments": {"path": "a.txt", "content": "x y\\n"}}\n</tool_call>'
    assert render_call('\n{"name": "write_file"', "write_file", args, end) == full
    assert render_call('\n{"name": "write_file", "arguments": {"content": "x', "write_file", args, end) == \
        '\n{"name": "write_file", "arguments": {"content": "x y\\n", "path": "a.txt"}}\n</tool_call>'
    compact = render_call('{"name":"write_file","arguments":{"path":"a', "write_file", args, end)
    assert compact == '{"name":"write_file","arguments":{"path":"a.txt","content":"x y\\n"}}\n</tool_call>'
    assert render_call('\n{"name": "bash"', "write_file", args, end) is None
    assert render_call('\n{"name": "write_file", "arguments": {"path": "b', "write_file", args, end) is None


def test_live_oracle_offers_only_the_calls_not_made_yet() -> None:
    """create_two_files: two write_file calls; after the first is made, the oracle must
    offer the second (it once re-supplied the first, and the task failed)."""
    from jumpahead.live.oracle import calls_left
    from jumpahead.live.world import make_task
    from jumpahead.proxy.openai_chat import parse_chat_request

    task = make_task(1000007, "create_two_files")
    ideal = [(c["name"], c["arguments"]) for c in ideal_calls(task)]
    assert len(ideal) == 2 and ideal[0][0] == ideal[1][0] == "write_file"
    first = ideal[0]
    body = {"model": "m", "messages": [
        {"role": "user", "content": task.prompt},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": first[0], "arguments": json.dumps(first[1])}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Wrote 1 line."}]}
    assert calls_left(parse_chat_request(body), ideal) == ideal[1:]
    assert calls_left(parse_chat_request({"model": "m", "messages": body["messages"][:1]}), ideal) == ideal
    # a call with other arguments is not the ideal one: both stay
    body["messages"][1]["tool_calls"][0]["function"]["arguments"] = json.dumps({**first[1], "content": "wrong"})
    assert calls_left(parse_chat_request(body), ideal) == ideal


def test_live_oracle_prefers_the_call_the_model_names() -> None:
    """Two write_file calls fit `{"name": "write_file"`: the oracle offers the one whose
    path the model's reasoning names last, not the first in the ideal order."""
    from jumpahead.live.oracle import named_last
    calls = [("write_file", {"path": "notes/cat.txt", "content": "meow"}),
             ("write_file", {"path": "notes/dragon.txt", "content": "roar"})]
    assert named_last("I write notes/dragon.txt now.", calls) == 1
    assert named_last("First notes/dragon.txt, then notes/cat.txt.", calls) == 0
    assert named_last("I write the files.", calls) == 0


def _said(rec: dict, content: str) -> dict:
    rec["turns"][0]["content"] = content
    return rec


def test_versus_pairs_an_arm_with_the_arm_it_extends() -> None:
    """`default+drafter` against `default` (not against ordinary): time to success saved
    over the seeds both solve or retry within the budget, a fast failure charged its redo
    (never a saving), and outputs compared seed by seed."""
    t = lambda s: _turn(s, 0.1, s - 0.1, PLAIN, 11, 11)  # noqa: E731 - a turn of s seconds
    records = [_rec("ordinary", 1, True, 3.0, [t(3.0)]), _rec("ordinary", 2, True, 3.0, [t(3.0)]),
               _rec("ordinary", 3, False, 3.0, [t(3.0)]),
               _said(_rec("default", 1, True, 2.0, [t(2.0)]), "a"), _said(_rec("default", 2, True, 2.0, [t(2.0)]), "b"),
               _said(_rec("default", 3, False, 2.0, [t(2.0)]), "c"),
               _said(_rec("default+drafter", 1, True, 1.5, [t(1.5)]), "a"),
               # seed 2: fails fast where default solved it: charged ordinary's redo
               _said(_rec("default+drafter", 2, False, 0.2, [t(0.2)]), "b?"),
               _said(_rec("default+drafter", 3, False, 1.0, [t(1.0)]), "c")]
    s = summarize(records, ["ordinary", "default", "default+drafter"])
    assert set(s["versus"]) == {"default+drafter"}  # ordinary and default extend nothing in the run
    v = s["versus"]["default+drafter"]
    assert v["base"] == "default" and v["seeds"] == 3 and v["outputs_equal"] == 2
    assert v["successes"] == {"default": 2, "default+drafter": 1}
    # seed 3 has no time to success in either arm; seeds 1 and 2 pair: +0.5 s and 2.0 - (0.2 + 3.0) s
    assert v["paired_tasks"] == 2
    assert v["tts_s_saved_per_task"]["mean"] == pytest.approx((0.5 + (2.0 - 3.2)) / 2)
    assert v["tts_s_saved_per_task"]["mean"] < 0.5  # the fast failure did not count as a saving


def test_arms_map_to_servers_and_requests() -> None:
    arms = {a.name: a for a in parse_live_arms("echo,default+oracle-jump,mistaken-jump:rate=0.3,base=oracle")}
    # only an arm that runs method "drafter" loads a drafter
    assert list(arms)[0] == "ordinary" and arms["ordinary"].serve_args() == ["--methods", "none", "--drafter", "none"]
    assert arms["echo"].request_field() == {"methods": ["echo", "none"]}
    assert arms["default+oracle-jump"].serve_args() == ["--drafter", "none",
                                                        "--policy", "jumpahead.live.oracle:LiveOracleJump"]
    assert parse_live_arm("default").serve_args() == ["--drafter", "none"]
    assert arms["default+oracle-jump"].request_field() == {} and arms["default+oracle-jump"].oracle
    assert arms["mistaken-jump:rate=0.3,base=oracle"].policies == [
        "jumpahead.live.oracle:LiveMistakenJump:rate=0.3,base=oracle"]
    # a method added to the server's defaults: the request names them all, strict fill stays on
    drafted = parse_live_arm("default+drafter")
    assert drafted.request_field() == {"methods": ["echo", "drafter"]} and drafted.serve_args() == ["--methods", "none"]
    with pytest.raises(ArmError, match="already runs echo"):
        parse_live_arm("default+echo")
    from jumpahead.live.oracle import LiveOracleJump
    from jumpahead.policies.registry import parse_spec

    assert isinstance(parse_spec(arms["mistaken-jump:rate=0.3,base=oracle"].policies[0]).build().base, LiveOracleJump)


def test_jobs_pair_seeds_and_rotate_arms() -> None:
    from jumpahead.live.command import jobs

    arms = parse_live_arms("echo,jump")
    order = [(seed, arm.name) for seed, arm in jobs([7, 8, 9], arms)]
    assert order == [(7, "ordinary"), (7, "echo"), (7, "jump"), (8, "echo"), (8, "jump"), (8, "ordinary"),
                     (9, "jump"), (9, "ordinary"), (9, "echo")]


def test_resume_keeps_done_tasks_and_runs_none_twice(tmp_path) -> None:
    from jumpahead.live.agent import AgentOptions
    from jumpahead.live.command import LiveOptions, run_live

    arms = parse_live_arms("echo")
    done = [dict(_rec(a.name, s, s == 1, 1.0 + s, [_turn(1.0, 0.1, 1.0, PLAIN, 11, 11)]), job=i)
            for i, (s, a) in enumerate([(1, arms[0]), (1, arms[1]), (2, arms[1]), (2, arms[0])])]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done) + '{"cut')
    (tmp_path / "summary.json").write_text(json.dumps({"run": {"wall_s": 2520.5}}))  # the earlier pass's
    summary = run_live(LiveOptions(arms=arms, seeds=[1, 2], out=tmp_path, quiet=True, resume=True,
                                   agent=AgentOptions()))
    assert len((tmp_path / "tasks.jsonl").read_text().splitlines()) == 4
    # a pass that ran nothing adds (next to) nothing to the earlier pass's wall time
    assert 2520.5 <= summary["run"]["wall_s"] < 2530
    # the earlier run (before passes were recorded) is pass 0; this pass ran no task
    assert [p["tasks"] for p in summary["run"]["passes"][1:]] == [0] and len(summary["run"]["passes"]) == 2
    assert summary["per_arm"]["echo"]["successes"] == 1 and summary["per_arm"]["echo"]["tasks"] == 2


@pytest.mark.timeout(400)
def test_resume_runs_an_unfinished_seed_again_in_full_and_records_each_pass(tmp_path, tiny_model_dir) -> None:
    """A seed whose arms did not all finish is run again in every arm in the new pass
    (paired arms must share a pass: another session may be another CPU), its old records
    set aside, not lost; every record names its pass and the run lists each pass's
    commit and machine. Real servers of the tiny model run the unfinished seed."""
    from jumpahead.live.agent import AgentOptions
    from jumpahead.live.command import PARTIAL, LiveOptions, run_live
    from jumpahead.live.world import split_seeds

    arms = parse_live_arms("echo")
    seeds = split_seeds("heldout", 2)
    earlier = [dict(_rec(a.name, s, False, 1.0, [_turn(1.0, 0.1, 1.0, PLAIN, 11, 11)]), job=i)
               for i, (s, a) in enumerate([(seeds[0], arms[0]), (seeds[0], arms[1]), (seeds[1], arms[1])])]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
    first_pass = {"commit": "0" * 40, "dirty": False, "machine": {"cpu_model": "an earlier CPU", "cpus": 2},
                  "finished_utc": "2026-12-01 00:00:00", "wall_s": 100.0}
    (tmp_path / "summary.json").write_text(json.dumps({"run": {**first_pass, "records": "tasks.jsonl"}}))
    summary = run_live(LiveOptions(arms=arms, seeds=seeds, out=tmp_path, quiet=True, resume=True,
                                   model=str(tiny_model_dir),
                                   agent=AgentOptions(max_steps=1, max_tokens=4, timeout_s=60)))
    lines = [json.loads(x) for x in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    assert sorted((r["arm"], r["seed"]) for r in lines) == sorted((a.name, s) for a in arms for s in seeds)
    by_seed = {s: {r.get("pass", 0) for r in lines if r["seed"] == s} for s in seeds}
    assert by_seed == {seeds[0]: {0}, seeds[1]: {1}}  # the unfinished seed ran again, both arms in pass 1
    set_aside = [json.loads(x) for x in (tmp_path / PARTIAL).read_text().splitlines()]
    assert [(r["arm"], r["seed"]) for r in set_aside] == [(arms[1].name, seeds[1])]
    passes = summary["run"]["passes"]
    assert len(passes) == 2 and passes[0]["machine"]["cpu_model"] == "an earlier CPU"
    assert passes[1]["tasks"] == 2 and passes[1]["machine"]["cpus"] >= 1 and "commit" in passes[1]
    assert summary["per_arm"]["echo"]["tasks"] == 2


def test_cli_unknown_arm_and_kind(capsys) -> None:
    assert main(["live", "--arms", "ordinary,warp-drive", "--tasks", "1"]) == 2
    assert "unknown arm 'warp-drive'" in capsys.readouterr().err
    assert main(["live", "--arms", "ordinary", "--kinds", "juggling", "--tasks", "1"]) == 2
    assert "unknown task kind" in capsys.readouterr().err


@pytest.mark.timeout(400)
def test_two_tasks_two_arms_through_real_servers(live_run) -> None:
    """The tiny random-weight model fails the tasks: what is checked is the
    accounting (pairing, every task recorded, failures in time over all, the summary's
    arithmetic from the per-task records, ordered CI bounds). The run is conftest.py's
    `live_run` (tests/test_writeup.py writes its write-up)."""
    out, summary = live_run
    arms, seeds = parse_live_arms(summary["arms"]), summary["seeds"]
    lines = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    assert sorted((r["arm"], r["seed"]) for r in lines) == sorted((a.name, s) for a in arms for s in seeds)
    assert json.loads((out / "summary.json").read_text())["per_arm"].keys() == summary["per_arm"].keys()
    assert (out / "report.html").read_text().count("<section>") >= 4
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 2 + len(summary["per_arm"]) and all(f"| {a} |" in "\n".join(table) for a in summary["arms"])
    assert {r["seed"] for r in lines if r["arm"] == "ordinary"} == {r["seed"] for r in lines if r["arm"] == "oracle-jump"}
    assert any(t.get("timings", {}).get("decode_s") is not None for r in lines for t in r["turns"])
    # each arm's server as /health described it; neither arm runs method drafter, so none loaded one
    by_arm = summary["run"]["served_by_arm"]
    assert set(by_arm) == set(summary["arms"]) and all(s["model"] and s["drafter"] is None for s in by_arm.values())
    assert summary["run"]["served"] in by_arm.values()
    again = summarize(lines, [a.name for a in arms])
    for arm in summary["arms"]:
        s, recs = summary["per_arm"][arm], [r for r in lines if r["arm"] == arm]
        assert s["tasks"] == len(recs) == 2
        assert s["successes"] == sum(r["success"] for r in recs)
        assert s["status"] == {st: sum(r["status"] == st for r in recs) for st in {r["status"] for r in recs}}
        assert s["wall_s_all"]["n"] == 2  # failures and timeouts included
        assert s["wall_s_all"]["total"] == pytest.approx(sum(r["wall_s"] for r in recs), abs=1e-3)
        lo, hi = s["success_ci95"]
        assert 0 <= lo <= s["success_rate"] <= hi <= 1
        for key in ("net_s_per_task", "tts_s_saved_per_task", "R_s_per_task", "gain_s_per_task"):
            # over the seeds both arms solved within the retry budget; none: all pairs unsolved
            assert s[key]["n"] == s["totals"]["tasks"] == s["paired_seeds"] - s["unsolved_pairs"], key
            if s[key]["n"]:
                assert s[key]["lo"] <= s[key]["mean"] <= s[key]["hi"], key
        assert s["totals"] == again["per_arm"][arm]["totals"]
        for a in summary["accounts"][arm]:
            rec = next(r for r in recs if r["seed"] == a["seed"])
            base = next(r for r in lines if r["arm"] == "ordinary" and r["seed"] == a["seed"])
            assert a == task_account(rec, base, summary["plain_round_s"])
