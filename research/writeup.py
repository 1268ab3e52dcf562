"""`jumpahead write-up`: the research write-up (docs/research.md) from a live run's summary.

`jumpahead write-up --run DIR --out docs/research.md` reads DIR/summary.json (the
summary `jumpahead live` writes, live/summary.py; DIR may also be the JSON file itself)
and, where the run's raw per-task records are kept beside it (tasks.jsonl, or the
write-up's own tasks.jsonl.gz), rebuilds the summary from them with the current code
(live/run_records.py; the earlier summary gives only the run's description), keeps the
records next to the page (tasks.jsonl.gz), copies the summary next to the page (docs/research/summary.json: sorted keys, indented; without
its per-task `accounts` when the whole would pass COPY_LIMIT bytes), draws the figures
as SVG into the same folder (research/writeup_figures.py) and writes the page.

The page is a pure function of that copy and of the definitions it quotes from
traces/accounting.py's docstring: every number is read from the JSON and every sentence
that compares arms is computed from it (research/writeup_text.py), so building again from
docs/research/summary.json gives the same page (tests/test_writeup.py checks the
committed one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import writeup_text as wt

COPY_LIMIT = 200_000  # bytes of the pretty-printed summary above which `accounts` is left out of the copy
DEFAULT_OUT = "docs/research.md"

MECHANISMS: dict[str, str] = {
    "strict fill": "Template and grammar tokens that the chat template or the request's grammar fixes (a tool "
                   "call's opening markers, JSON punctuation) are proposed without sampling and kept only where the "
                   "model's own sampler picks them, so the output equals ordinary decoding (engine/strict/fill.py, "
                   "engine/strict/scaffold.py, engine/strict/grammar.py). Arms: `strict`, and `default` with echo.",
    "echo": "Spans the context already holds (a file's text the agent read, the task's wording) are copied from "
            "the longest recent match of the output's suffix and verified by the model like speculative "
            "decoding; the span adapts to the row's acceptance (engine/methods/echo.py). Exact. Arms: `echo`, `default`.",
    "online jumps": "Once the model has opened a tool call and fixed its destination, and the context already "
                    "holds the complete literal content of the remaining arguments, the rest of the call is "
                    "appended unverified as `jump` tokens in the model's own format; the model samples again "
                    "after the call's end marker (policies/jump.py `Jump`, policies/jump_plan.py, "
                    "policies/jump_sources.py). Arm: `jump`; `jump:sources=output|context` keeps only the jumps "
                    "whose content this turn's output stated, or only those the prompt's context holds (tool "
                    "results, earlier calls, earlier messages); `verify=1` proposes the same content for "
                    "verification instead (the model checks it token by token, like echo: exact).",
    "earlier action selection": "The whole next call proposed one step earlier, at the reasoning boundary "
                                "before the model opens it: when the reasoning ends, or (for a model that reasons "
                                "in plain text, as the live adapter does) when a fenced block whose lead names a "
                                "file has closed, the write, edit or command that block settles is appended in "
                                "the model's own format, start and end markers included, under the same "
                                "ambiguity rules as online jumps (policies/early_jump.py `EarlyJump`, the "
                                "`block_closed` boundary of policies/tracker.py). Arms: `early-jump`, "
                                "`early-jump:verify=1` (verified: exact).",
    "oracle jumps": "The same jump, driven by an oracle; only content present before the jump point is supplied "
                    "(policies/jump.py `OracleJump`). The hindsight oracle is the model's own future: the ordinary "
                    "arm's recorded output of the same turn of the same seed, sent only while the conversation still "
                    "equals the recording (live/oracle.py `LiveHindsightJump`); it is the upper bound for jumps that "
                    "are always right. Arm: `hindsight-jump`. The steering oracle sends the task's ideal calls with "
                    "each request (live/oracle.py `LiveOracleJump`): it can lead the model to calls it would not "
                    "have made, so it is labelled steering, never the upper bound. Arm: `steering-jump` (old name "
                    "`oracle-jump`).",
    "mistaken jumps": "The same jumps with a fraction of them perturbed deterministically (a wrong path, "
                      "truncated content, another file's content), to measure whether and at what cost the agent "
                      "notices and recovers (policies/jump.py `MistakenJump`; with `base=oracle`, live/oracle.py "
                      "`LiveMistakenJump`). Arms: `mistaken-jump:rate=R[,base=oracle]`.",
    "compaction": "A context rewrite rather than supplied tokens: the reasoning of finished tool steps becomes a "
                  "compact account, replayed byte for byte at later turns and committed only when the tokens it "
                  "removes pay for the re-prefill (policies/compaction.py, policies/sticky.py, "
                  "policies/account.py). It supplies nothing, so its D is 0 and any change shows in the measured "
                  "time. Arm: `compaction`.",
}
MECHANISM_OF_PART = {"strict": "strict fill", "echo": "echo", "default": "echo + checked strict fill (server default)",
                     "ngram": "n-gram proposals", "draft": "draft model", "jump": "online jumps",
                     "early-jump": "earlier action selection", "oracle-jump": "oracle jumps",
                     "hindsight-jump": "oracle jumps", "steering-jump": "oracle jumps", "mistaken-jump": "mistaken jumps", "compaction": "compaction",
                     "ordinary": "none (ordinary decoding)"}


# --- the summary and its copy ----------------------------------------------------------------


def load_summary(run: Path) -> dict[str, Any]:
    """The summary of a live run: DIR/summary.json, or `run` itself when it is a file."""
    path = run / "summary.json" if run.is_dir() else run
    summary = json.loads(path.read_text())
    if not isinstance(summary, dict) or "per_arm" not in summary:
        raise ValueError(f"{path} is not a live run's summary (no per_arm)")
    return summary


def copy_text(summary: dict[str, Any]) -> str:
    """The summary as the write-up keeps it: sorted keys, indented; without the per-task
    `accounts` when the whole is larger than COPY_LIMIT bytes."""
    text = json.dumps(summary, indent=1, sort_keys=True) + "\n"
    if len(text.encode()) > COPY_LIMIT and "accounts" in summary:
        text = json.dumps({k: v for k, v in summary.items() if k != "accounts"}, indent=1, sort_keys=True) + "\n"
    return text


# --- the page --------------------------------------------------------------------------------


def command_of(summary: dict[str, Any]) -> str:
    """The command that made the run, as the run recorded it (or its options where the
    runner of that run did not record one)."""
    run = summary.get("run") or {}
    if run.get("command"):
        return str(run["command"])
    arms = ",".join(wt.arms_of(summary))
    return (f"jumpahead live --tasks {run.get('tasks_per_arm', len(summary.get('seeds', [])))} --arms {arms}"
            + (f" --adapter {run['adapter']}" if run.get("adapter") else "")
            + "  # reconstructed: this run's runner did not record its command line")


def _table_section(title: str, text: str, table: str, number: int, caption: str, command: str) -> list[str]:
    """A section that explains a table, then the table and its caption."""
    return [f"## {title}", "", text, "", table, "", _caption("Table", number, caption, command), ""]


def _caption(kind: str, n: int | str, text: str, command: str) -> str:
    return f"*{kind} {n}. {text} Run: `{command}`.*"


def _run_section(summary: dict[str, Any], command: str) -> list[str]:
    run = summary.get("run") or {}
    agent, served, mach = run.get("agent") or {}, run.get("served") or {}, run.get("machine") or {}
    seeds = summary.get("seeds") or run.get("seeds") or []
    tasks = summary.get("tasks") or {}
    source = {"command line": "as the runner recorded its command line",
              "run_live options": "the runner's equivalent of the options run_live was called with"}
    how = source.get(run.get("command_source"), "not recorded by its runner: reconstructed from the summary")
    lines = ["## The run", "", f"The command that made the run ({how}):", "",
             "```sh", command, "```", ""]
    facts = [f"tasks per arm: {wt.num(run.get('tasks_per_arm', len(seeds)))}, the same seeds in every arm"
             + (f" ({wt.num(seeds[0])} to {wt.num(seeds[-1])})" if seeds else ""),
             f"arms: {wt.num(len(wt.arms_of(summary)))} ({', '.join(f'`{a}`' for a in wt.arms_of(summary))})"]
    if tasks.get("kind"):
        facts.append("task kinds: " + ", ".join(f"{k} {wt.num(n)}" for k, n in tasks["kind"].items()))
    if tasks.get("steps"):
        facts.append("ideal solutions: " + ", ".join(
            f"{wt.num(n)} tasks of {k} tool call(s)" for k, n in tasks["steps"].items()))
    if agent:
        facts.append(f"agent: at most {wt.num(agent.get('max_steps'))} model turns and "
                     f"{wt.num(agent.get('max_tokens'))} "
                     f"tokens per turn, {wt.num(agent.get('timeout_s'), 0)} s per task, temperature "
                     f"{wt.num(agent.get('temperature'), 1)}")
    facts.append(f"model: {served.get('model') or run.get('model') or 'the default model'}"
                 + (f", adapter {run['adapter']}" if run.get("adapter") else ", no adapter")
                 + (f", device {served['device']}" if served.get("device") else ""))
    if mach:
        facts.append("machine: " + (f"{mach['cpu_model']}, " if mach.get("cpu_model") else "")
                     + f"{wt.num(mach.get('cpus'))} CPU cores, {mach.get('platform')}"
                     + "".join(f", {k}={v}" for k, v in (mach.get("env") or {}).items()))
    if "commit" in run:
        facts.append("code: " + (f"commit `{run['commit']}`" + (" with uncommitted changes" if run.get("dirty") else "")
                                 if run.get("commit") else "commit not recorded (no git where it ran)")
                     + ("; the raw per-task records are kept with the run (tasks.jsonl; tasks.jsonl.gz next to this "
                        "page), and this summary is rebuilt from them" if run.get("records") else ""))
    passes = run.get("passes") or []
    if len(passes) > 1:  # a --resume'd run: each seed's arms ran in one pass, on that pass's machine
        facts.append(f"run in {wt.num(len(passes))} passes (`--resume`; every seed's arms in one pass): " + "; ".join(
            f"pass {i}: {wt.num(p.get('tasks')) + ' tasks, ' if p.get('tasks') is not None else ''}"
            f"{(p.get('machine') or {}).get('cpu_model') or 'CPU not recorded'}, "
            + (f"commit `{p['commit'][:12]}`" + (" with uncommitted changes" if p.get("dirty") else "")
               if p.get("commit") else "commit not recorded")
            for i, p in enumerate(passes)))
    facts.append(f"tasks in flight: {wt.num(run.get('concurrency'))}; run wall time {wt.num(run.get('wall_s'), 1)} s"
                 + (f", finished {run['finished_utc']} UTC" if run.get("finished_utc") else ""))
    facts.append(f"plain round (the ordinary arm's median one-token decode round): "
                 f"{wt.num(summary.get('plain_round_s'), 4)} s")
    lines += [f"- {f}" for f in facts] + ["", "Arms of this run (live/arms.py):", ""]
    lines += ["| arm | mechanism | server options | per-request `jumpahead` field | oracle sent |",
              "|---|---|---|---|---|"]
    arms = run.get("arms") or {}
    for arm in wt.arms_of(summary):
        a = arms.get(arm) or {}
        parts = [p.partition(":") for p in arm.split("+")]
        mech = " + ".join(MECHANISM_OF_PART.get(head, f"user arm `{head}`") + (f" ({opts})" if opts else "")
                          for head, _, opts in parts)
        lines.append(f"| {arm} | {mech} | `{' '.join(a.get('serve_args') or []) or '(none)'}` "
                     f"| `{json.dumps(a.get('request', {}), sort_keys=True)}` "
                     f"| {'ideal calls' if a.get('oracle') else 'recorded output' if a.get('hindsight') else 'no'} |")
    return lines + ["", _caption("Table", 1, "The arms.", command), ""]


def _mechanism_section(summary: dict[str, Any]) -> list[str]:
    present = {MECHANISM_OF_PART.get(p.split(":")[0]) for a in wt.arms_of(summary) for p in a.split("+")}
    present |= {"echo", "strict fill"} if any("default" in a.split("+") for a in wt.arms_of(summary)) else set()
    lines = ["## The mechanism", ""]
    for name, text in MECHANISMS.items():
        where = "an arm of this run" if name in present else "not in this run"
        lines += [f"**{name[0].upper() + name[1:]}** ({where}). " + text, ""]
    return lines


def _accounting_section(summary: dict[str, Any]) -> list[str]:
    from jumpahead.traces import accounting

    doc = (accounting.__doc__ or "").strip()
    retries = summary.get("retries")
    lines = ["## The accounting", "",
             "The definitions, quoted from traces/accounting.py (the one module that forced replay and live runs "
             "both price interventions with):", ""]
    lines += [f"> {line}".rstrip() for line in doc.splitlines()] + [""]
    lines += [f"This run's retry budget: {wt.num(retries)} ordinary redo(s) after a failed attempt." if retries
              is not None else "This run's summary does not record its retry budget.", "",
              "How the summary (live/summary.py) reads them off a live turn, as this run recorded it:", ""]
    lines += [f"- {n}" for n in summary.get("notes", [])] + [""]
    n = summary.get("bootstrap_resamples")
    lines += ["Intervals: success rates and wrong-jump rates carry a Wilson score 95% interval; per-task figures "
              "(D - P - H, the measured saving, R, net) are means over the seeds where both the arm and the ordinary "
              "arm reach a success, a failed attempt paying its redo, with a percentile bootstrap 95% CI that "
              "resamples the seeds" + (f" ({wt.num(n)} resamples, seeded: a rebuild gives the same bounds)" if n else "")
              + "; R's CI also resamples the plain round (the median of a resample of the ordinary arm's one-token "
                "rounds), since D and P move with it; cost per recovery and the break-even wrong-jump rate carry "
                "bootstrap intervals over tasks; arms are compared with each other pair by pair "
                "(live/comparisons.py) with Holm's correction over the pairs.", ""]
    return lines


def render(summary: dict[str, Any], figs: str = Path(DEFAULT_OUT).stem) -> str:
    """The Markdown page of `summary`, its figures and summary copy linked under the
    folder `figs` next to it (the page's name without .md)."""
    command = command_of(summary)
    from .writeup_figures import FIGURES

    fig_no = {name: i + 1 for i, name in enumerate(FIGURES)}

    def figure(name: str) -> list[str]:
        return [f"![{name}]({figs}/{name}.svg)", "", _caption("Figure", fig_no[name], FIGURES[name][1], command), ""]

    cmp = wt.compared(summary)
    lines = ["# Supplied continuations in a live agent loop: what they replace, what recovery costs", "",
             f"<!-- generated by `jumpahead write-up` (research/writeup.py) from {figs}/summary.json; "
             "edit the generator, not this file -->", "",
             "## The question", "",
             "How much of a coding agent's decode time can continuations that the runtime supplies, instead of "
             "sampling them, replace; and what does it cost when a supplied continuation is wrong and the agent "
             "has to notice and recover? This page answers for one live run: real servers, a minimal agent loop, "
             "the same tasks in every arm, paired by seed against ordinary decoding.", "",
             wt.headline(summary), ""]
    lines += _mechanism_section(summary) + _run_section(summary, command) + _accounting_section(summary)
    lines += ["## Results", "", wt.results_table(summary), "",
              _caption("Table", 2, "Per arm: success with its Wilson 95% interval; D, P, H, R and net totals in "
                       "seconds over the paired seeds; per-task means with bootstrap 95% CIs.", command), ""]
    lines += figure("success") + figure("dphr") + figure("saving")
    lines += ["Against the ordinary arm:", ""] + [f"- {wt.success_sentence(summary, a)}" for a in cmp]
    lines += [f"- {wt.saving_sentence(summary, a)}" for a in cmp]
    lines += [f"- {wt.r_sentence(summary, a)}" for a in cmp] + [""]
    lines += _comparison_section(summary, command)
    lines += _kind_groups_section(summary, command)
    lines += _table_section("Ground truth",
              "Each call is judged by its effect on the workspace against the state the task's ideal solution "
              "leaves (live/ground_truth.py), not by its result text: `right`, `harmless` (changed nothing, did "
              "not fail) or `wrong` (a silent wrong write, an extra or deleted file, an error, a non-zero exit); "
              "texts are compared as the task checks compare them (trailing spaces and newlines aside). A task "
              "with a wrong call has its files repaired when a later call puts them back, unnoticed when no later "
              "call touches them, else not repaired.", wt.truth_table(summary), 3, "Ground truth per arm.", command)
    lines += [f"- {wt.truth_sentence(summary, a)}" for a in wt.arms_of(summary)] + [""]
    lines += _table_section("Recovery and break-even",
              "A jump is wrong when its policy perturbed it or the call it supplied is wrong by the ground truth "
              "(per call: another call of its turn does not blame it; a jump that cannot be tied to one call of "
              "a several-call turn is counted as unattributed). A wrong jump's tokens count nothing in D. A task "
              "is recovered when its arm made a wrong supplied call and still succeeded, unrecovered when it "
              "failed. Wrong-jump rate = wrong jumps / jumps; cost per recovery = R of the tasks with a wrong "
              "jump / wrong jumps (pooled over arms where an arm has no measured one); break-even wrong-jump "
              "rate = (D - P - H) / (jumps x cost per recovery): the rate at which their cost would cancel what "
              "the jumps save.", wt.recovery_table(summary), 4, "Recovery per arm that made jumps.", command)
    lines += figure("recovery")
    lines += [f"- {s}" for s in (wt.breakeven_sentence(summary, a) for a in wt.arms_of(summary)) if s] + [""]
    lines += _limits_section(summary) + ["## Reproduce", "", "```sh", command,
                                         "jumpahead write-up --run OUT --out PAGE.md", "```", "",
                                         f"OUT is the run's `--out` folder and PAGE.md this page (here PAGE is "
                                         f"`{figs}`); `--run {figs}/summary.json`, the copy next to this page, "
                                         "rebuilds the page and its figures.", ""]
    return "\n".join(lines)


def _comparison_section(summary: dict[str, Any], command: str) -> list[str]:
    """Every pair of arms on the same seeds: which supplied continuation pays more, said
    only where the corrected comparison shows it (live/comparisons.py)."""
    table = summary.get("comparisons") or {}
    head = ["## Arm against arm", "",
            "Each pair of arms on the seeds where both reach a success within the retry budget: the saving in time "
            "to success of b over a per task, with its bootstrap 95% CI and a Bonferroni-corrected CI (95% jointly "
            "over the pairs), a paired sign-flip test's p and Holm's adjustment over the "
            f"{wt.num(table.get('family'))} pairs. A faster arm is named only where the Holm p is under "
            f"{wt.num(table.get('alpha'))} and the corrected CI excludes 0." if table else
            "Each pair of arms on the same seeds (live/comparisons.py).", "", wt.comparison_table(summary), ""]
    if not table:
        return head
    return head + [_caption("Table", "2c", "Arm against arm, paired by seed, Holm-corrected.", command), ""] + \
        [f"- {line}" for line in wt.comparison_sentences(summary)] + [""]


def _kind_groups_section(summary: dict[str, Any], command: str) -> list[str]:
    """Short and long task kinds apart (summary `kind_groups`), where the run has long ones."""
    from jumpahead.live.report import group_table

    if "long" not in (summary.get("kind_groups") or {}):
        return []
    return ["## Short and long task kinds", "", group_table(summary, min_groups=1).strip(), "",
            _caption("Table", "2b", "Per kind group and arm: solved, turns per task, looped tasks (one call "
                     "repeated three times in a row), median time to success, and D, P, H, R over the group's "
                     "paired seeds.", command), ""]


def _limits_section(summary: dict[str, Any]) -> list[str]:
    run = summary.get("run") or {}
    served, mach, agent = run.get("served") or {}, run.get("machine") or {}, run.get("agent") or {}
    steps = (summary.get("tasks") or {}).get("steps") or {}
    unsolved = {a: summary["per_arm"][a].get("unsolved_pairs", 0) for a in wt.arms_of(summary)}
    model = served.get("model") or run.get("model") or "the default model"
    lines = ["## Limits", "",
             f"- One small model: {model}"
             + (f" with the `{run['adapter']}` LoRA adapter" if run.get("adapter") else "")
             + (f", on {wt.num(mach['cpus'])} CPU cores" if mach.get("cpus") else "")
             + (f" ({mach['cpu_model']}" + (", no accelerator" if "cpu" in str(served.get("device")) else "") + ")"
                if mach.get("cpu_model") else "")
             + ". Round times, and so D, P and H, are this machine's; a larger model on an accelerator has another "
               "plain round and another cost of carrying supplied tokens.",
             "- A synthetic task world (live/world.py): small file edits and commands with an independent check "
             "on the workspace, not real repositories.",
             *(["- Jump eligibility is manufactured: the adapter was trained on conversations that state each "
                "call's content in a fenced block before the call (live/trajectories.py), which is what the online "
                "and early jumps read; a model that does not write its content first leaves them little to supply."]
               if any(p.split(":")[0] in ("jump", "early-jump") for a in wt.arms_of(summary) for p in a.split("+"))
               else []),
             ("- Short and long tasks, reported apart above; the long kinds' figures rest on fewer seeds."
              if "long" in (summary.get("kind_groups") or {}) else
              "- Short tasks: "
              + (f"the ideal solutions need {' or '.join(steps)} tool call(s)" if steps
                 else "the task kinds of live/world.py")
              + (f", at most {wt.num(agent.get('max_steps'))} model turns per task" if agent.get("max_steps") else "")
              + "; long, reasoning-heavy tasks may change every figure here. The task world has them "
                "(live/world.py LONG_KINDS: add_feature, rename_symbol, 14-27 calls, run with `--kinds`), but the "
                "shipped adapter was never trained on them, and on this machine training it is a GPU job "
                "(docs/live-adapter.md)."),
             f"- Time to success prices a failure with {wt.num(summary.get('retries'))} ordinary redo(s) (the retry "
             "budget); pairs neither side solves within it are left out of the paired figures: "
             + ", ".join(f"`{a}` {wt.num(n)}" for a, n in unsolved.items()) + ".",
             f"- {wt.num(len(summary.get('seeds') or []))} seeds per arm: the CIs above are as wide as that allows.",
             *([] if summary.get("rejected_rounds_priced", False) else [
                 "- This run's traces do not say which decode rounds carried proposal tokens (they predate that "
                 "field of the trace's `round_ms`): rounds whose proposals were all rejected could not be priced "
                 "in P, so their cost is in R, and an exact arm's R (echo, verified jumps) measures them, not "
                 "recovery."]),
             ""]
    return lines


def rebuilt(run: Path) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """The summary of `run` and its raw records: rebuilt from the records by the current
    code where the run keeps them (its `run` description taken from the earlier
    summary), else the summary as it was written."""
    from jumpahead.live.run_records import read_records, summary_of

    earlier = load_summary(run)
    records = read_records(run if run.is_dir() else run.parent)
    if not records:
        return earlier, None
    return summary_of(records, wt.arms_of(earlier), earlier.get("run")), records


def build(run: Path, out: Path) -> dict[str, Path]:
    """Write the page, its figures, the summary copy and (where the run keeps them) its
    records; the paths written by name."""
    from jumpahead.live.run_records import TASKS_GZ, write_records_gz
    from .writeup_figures import write_figures

    fresh, records = rebuilt(run)
    summary = json.loads(copy_text(fresh))
    folder = out.parent / out.stem
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / "summary.json"
    copy.write_text(copy_text(summary))
    paths = {"summary": copy, **write_figures(summary, folder, command_of(summary))}
    if records:
        paths["records"] = write_records_gz(records, folder / TASKS_GZ)
    out.write_text(render(summary, out.stem))
    return {"page": out, **paths}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, metavar="DIR",
                        help="a `jumpahead live` output folder (its summary.json; where it keeps tasks.jsonl, "
                             "the summary is rebuilt from those raw records with the current code), or a summary "
                             "JSON file (e.g. docs/research/summary.json: rebuilt from the tasks.jsonl.gz beside it "
                             "where there is one)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="FILE.md",
                        help=f"the page to write; figures and the summary copy go to the folder of its name "
                             f"(default: {DEFAULT_OUT}, docs/research/)")


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("jumpahead write-up: the figures need matplotlib: pip install -e '.[research]'", file=sys.stderr)
        return 2
    try:
        paths = build(Path(args.run), Path(args.out))
    except (OSError, ValueError) as exc:
        print(f"jumpahead write-up: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: str(v) for k, v in paths.items()}, indent=1))
    return 0
