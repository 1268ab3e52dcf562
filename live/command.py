"""`jumpahead live`: N tasks per arm, paired by seed, through real servers.

Each arm gets its own `jumpahead serve` subprocess (live/arms.py: its methods and
policies, `--trace-dir` for the engine's timings, RAM-only prefix cache, `--adapter`
passed through). Every arm runs the same seeds. Jobs are interleaved: seed i runs all
arms, in an order rotated by i, before seed i+1, so drift on a shared machine hits the
arms alike; a hindsight arm runs last, after the ordinary arm of the seed, whose recorded
outputs it is sent (live/oracle.py); `--concurrency K` keeps K jobs in flight. After each
task the runner joins
the server's trace of that task's session (one trace file per task) onto the agent's
turns (prefill/decode seconds, rounds), appends the record to `tasks.jsonl`, and at the
end writes `summary.json` (live/summary.py) and `report.html` (live/report.py). The
summary's `run` records the command line (for a run started through `run_live`, the
equivalent command), the model the servers report, the machine (CPU model, cores,
platform) and the git commit of the code (null without git): the research write-up
(`jumpahead write-up`, research/writeup.py) states them with every table and figure, and
rebuilds the summary from tasks.jsonl, the raw records kept with the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TASKS = 10
DEFAULT_SPLIT = "heldout"
SERVE_START_TIMEOUT_S = 600.0
STARTING_AT_ONCE = 3
PARTIAL = "tasks.partial.jsonl"  # records of seeds a --resume runs again (kept, not summarized)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=int, default=DEFAULT_TASKS, metavar="N",
                        help=f"tasks per arm, the same seeds in every arm (default: {DEFAULT_TASKS})")
    parser.add_argument("--arms", default="ordinary,default", metavar="LIST",
                        help="comma-separated arms (ordinary, strict, echo, default, jump, "
                             "jump:sources=output|context[,verify=1], early-jump[:verify=1], hindsight-jump (the ordinary "
                             "arm's recorded output, run after it), steering-jump (the task's ideal calls; "
                             "old name oracle-jump), mistaken-jump:rate=R[,base=hindsight|steering], "
                             "compaction, combinations with '+', "
                             "package.module:Class; 'all' for the full set); ordinary is added when missing")
    parser.add_argument("--adapter", default=None, metavar="PATH|NAME",
                        help="a LoRA adapter every arm's server loads (serve --adapter)")
    parser.add_argument("--model", default=None, metavar="PATH_OR_ID", help="serve --model for every arm")
    parser.add_argument("--kinds", default=None, metavar="LIST",
                        help="task kinds, comma-separated (default: every short kind, cycling by seed; "
                             "the long kinds add_feature and rename_symbol run only when named, each with "
                             "turns, tokens and time scaled to its ideal calls)")
    parser.add_argument("--seed-split", default=DEFAULT_SPLIT, choices=("train", "heldout"),
                        help=f"which seed range the tasks come from (default: {DEFAULT_SPLIT})")
    parser.add_argument("--seed-offset", type=int, default=0, metavar="K",
                        help="skip the first K seeds of the split (default: 0)")
    parser.add_argument("--concurrency", type=int, default=1, metavar="K", help="tasks in flight (default: 1)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output folder (default: ./live-runs/<time>): tasks.jsonl, summary.json, "
                             "report.html, table.md, traces/, servers/")
    parser.add_argument("--max-steps", type=int, default=6, metavar="N", help="model turns per task (default: 6; a long kind gets at least its ideal calls + 4)")
    parser.add_argument("--max-tokens", type=int, default=256, metavar="N", help="tokens per turn (default: 256)")
    parser.add_argument("--task-timeout", type=float, default=300.0, metavar="S",
                        help="wall-clock limit per task in seconds (default: 300)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="an extra argument for every arm's `jumpahead serve` (repeatable; "
                             "--serve-arg=--max-batch=4)")
    parser.add_argument("--keep-workspaces", action="store_true", help="keep each task's workspace under OUT/work")
    parser.add_argument("--record-drafter", action="store_true",
                        help="with arms default and default+drafter on held-out seeds: write the A/B into the "
                             "drafter folder that arm loaded (measured.json), where serve reads whether the "
                             "drafter pays and so joins its default methods")
    parser.add_argument("--resume", action="store_true",
                        help="keep the seeds OUT/tasks.jsonl holds in every arm and run the others (a seed "
                             "with only some arms done runs again in full, so a seed's arms always share a "
                             "pass and a machine; same --tasks, --arms and seeds); each pass's commit and "
                             "machine are recorded")


@dataclass
class LiveOptions:
    arms: list[Any]  # LiveArm
    seeds: list[int]
    kinds: list[str] | None = None
    out: Path = Path("live-run")
    adapter: str | None = None
    model: str | None = None
    concurrency: int = 1
    agent: Any = None  # AgentOptions
    serve_args: list[str] = field(default_factory=list)
    keep_workspaces: bool = False
    resume: bool = False  # keep the records OUT/tasks.jsonl holds; run the other jobs
    quiet: bool = False
    command: str | None = None  # the command line that started the run (None: run_live called directly)


ENV_RECORDED = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")  # settings that change the timings


def command_line(args: argparse.Namespace, out: Path) -> str:
    """The `jumpahead live` command line of `args` (the options that differ from their
    defaults, plus --tasks, --arms and the effective --out), behind the thread settings
    of the environment: what the write-up states as the command that made the run."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parts = [f"{k}={os.environ[k]}" for k in ENV_RECORDED if k in os.environ] + ["jumpahead", "live"]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag, value = action.option_strings[0], getattr(args, action.dest, action.default)
        if action.dest == "out":
            parts += [flag, str(out)]
        elif isinstance(action, argparse._StoreTrueAction):
            parts += [flag] if value else []
        elif isinstance(action, argparse._AppendAction):
            parts += [f"{flag}={v}" for v in value or []]
        elif value != action.default or action.dest in ("tasks", "arms"):
            parts += [flag, str(value)]
    return shlex.join(parts)


def equivalent_command(o: LiveOptions) -> str:
    """A `jumpahead live` command line that runs what `o` runs (for runs started through
    run_live, which has no command line); seeds outside one split's range are named in a
    trailing comment."""
    from .world import SPLIT_SIZE, split_seeds

    parts = ["jumpahead", "live", "--tasks", str(len(o.seeds)), "--arms", ",".join(a.name for a in o.arms)]
    for flag, value in (("--adapter", o.adapter), ("--model", o.model),
                        ("--kinds", ",".join(o.kinds) if o.kinds else None)):
        parts += [flag, value] if value else []
    split = "heldout" if o.seeds and o.seeds[0] >= SPLIT_SIZE else "train"
    offset = (o.seeds[0] % SPLIT_SIZE) if o.seeds else 0
    consecutive = o.seeds == split_seeds(split, offset + len(o.seeds))[offset:]
    parts += ["--seed-split", split] + (["--seed-offset", str(offset)] if offset else [])
    parts += ["--concurrency", str(o.concurrency)] if o.concurrency != 1 else []
    if o.agent is not None:
        parts += ["--max-steps", str(o.agent.max_steps), "--max-tokens", str(o.agent.max_tokens),
                  "--task-timeout", f"{o.agent.timeout_s:g}"]
        parts += ["--temperature", f"{o.agent.temperature:g}"] if o.agent.temperature else []
    parts += [f"--serve-arg={a}" for a in o.serve_args] + ["--out", str(o.out)]
    text = shlex.join(parts)
    return text if consecutive else f"{text}  # seeds {', '.join(map(str, o.seeds))}"


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo, else what platform says; None if neither)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def machine() -> dict[str, Any]:
    """The machine the run ran on (the write-up states it under the limits)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    return {"cpu_model": cpu_model(), "cpus": cpus, "cores_total": os.cpu_count(), "platform": platform.platform(),
            "arch": platform.machine(), "python": platform.python_version(),
            "env": {k: os.environ[k] for k in ENV_RECORDED if k in os.environ}}


def git_commit(where: Path | None = None) -> dict[str, Any]:
    """The commit of the code that ran (`git rev-parse HEAD` in the package's folder;
    null where that fails: an installed copy, no git) and whether tracked files differed
    from it (null where unknown): a run is recomputable from its records and this."""
    import subprocess

    cwd = str(where or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return {"commit": head.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def write_outputs(out: Path, records: list[dict[str, Any]], arms: list[str], run_info: dict[str, Any],
                  log: Any = None) -> dict[str, Any]:
    """The run's files from its records: tasks.jsonl (every record, in job order: the raw
    records the summary is rebuilt from), summary.json (live/run_records.py summary_of:
    the same function `jumpahead write-up` rebuilds it with), table.md and report.html."""
    from .run_records import TASKS, records_text, summary_of

    out.mkdir(parents=True, exist_ok=True)
    (out / TASKS).write_text(records_text(records))
    summary = summary_of(records, arms, run_info)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    try:
        from .report import markdown_table, write_report

        (out / "table.md").write_text(markdown_table(summary))
        write_report(summary, records, out / "report.html")
    except Exception as exc:  # the numbers are written; a plot problem must not lose them
        if log is not None:
            log(f"live: report failed: {type(exc).__name__}: {exc}")
    return summary


def jobs(seeds: list[int], arms: list[Any]) -> list[tuple[int, Any]]:
    """(seed, arm) in run order: per seed every arm, the arm order rotated by the seed's
    index; hindsight arms last, after the ordinary arm whose recording they are sent."""
    later = [a for a in arms if getattr(a, "hindsight", False)]
    rest = [a for a in arms if a not in later]
    out = []
    for i, seed in enumerate(seeds):
        k = i % len(rest) if rest else 0
        out += [(seed, arm) for arm in rest[k:] + rest[:k] + later]
    return out


def _task_for(seed: int, index: int, kinds: list[str] | None) -> Any:
    from .world import make_task

    return make_task(seed, kinds[index % len(kinds)] if kinds else None)


def _served(server: Any) -> dict[str, Any] | None:
    """The model, adapter, drafter, device and BLAS a server reports on /health (None if it does not answer)."""
    import httpx

    try:
        health = httpx.get(server.url + "/health", timeout=10).json()
    except Exception:  # noqa: BLE001 - a description, never a reason to fail the run
        return None
    return {k: health.get(k) for k in ("model", "adapter", "drafter", "device", "blas")}


def _join_trace(record: Any, path: Path, wait_s: float = 5.0) -> None:
    """Copy the server's timings of each turn onto the record's turns (file order = turn order)."""
    from jumpahead.traces.trace_file import read_trace

    deadline = time.monotonic() + wait_s
    turns: list[dict[str, Any]] = []
    while True:
        if path.exists():
            _, turns, _ = read_trace(path)
        if len(turns) >= len(record.turns) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for turn, traced in zip(record.turns, turns):
        t = traced.get("timings") or {}
        turn.timings = {k: t.get(k) for k in ("queue_s", "prefill_s", "decode_s", "total_s", "rounds", "round_ms")
                        if k in t}
        # the raw output (the decoded runs of output tokens): the hindsight arm's recording
        turn.output = "".join(r.get("text") or "" for r in (traced.get("response") or {}).get("runs") or [])


class Run:
    """One live run: servers up, jobs done, records written."""

    def __init__(self, options: LiveOptions) -> None:
        self.o = options
        self.out = Path(options.out)
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.servers: dict[str, Any] = {}
        self.served: dict[str, Any] = {}  # per arm, what its server reports (/health), in the order they came up
        self.done = 0
        self.pass_index = 0
        self._recorded = threading.Condition(self._lock)  # notified as each record is appended

    def ordinary_record(self, seed: int, timeout_s: float) -> dict[str, Any] | None:
        """The ordinary arm's record of `seed`, waiting for it while its job runs (None
        after `timeout_s`: the hindsight arm then runs without a recording)."""
        from jumpahead.traces.arms import BASELINE

        def find() -> dict[str, Any] | None:
            return next((r for r in self.records if r.get("arm") == BASELINE and r.get("seed") == seed), None)

        with self._recorded:
            self._recorded.wait_for(lambda: find() is not None, timeout=timeout_s)
            return find()

    def log(self, text: str) -> None:
        if not self.o.quiet:
            print(text, file=sys.stderr, flush=True)

    def start_servers(self) -> None:
        """One server per arm, STARTING_AT_ONCE loading at a time (loading is partly I/O)."""
        from concurrent.futures import ThreadPoolExecutor

        from .server_process import ServerProcess

        (self.out / "servers").mkdir(parents=True, exist_ok=True)

        def start(arm: Any) -> None:
            args = [*arm.serve_args(), "--trace-dir", str(self.out / "traces" / arm.slug), "--no-ssd-cache",
                    "--log-level", "warning", "--max-batch", str(max(1, self.o.concurrency))]
            if self.o.adapter:
                args += ["--adapter", self.o.adapter]
            if self.o.model:
                args += ["--model", self.o.model]
            args += list(self.o.serve_args)
            t0 = time.monotonic()
            server = ServerProcess(args, self.out / "servers" / f"{arm.slug}.log", start_timeout=SERVE_START_TIMEOUT_S)
            with self._lock:
                self.servers[arm.name] = server
                self.served[arm.name] = _served(server)
            self.log(f"live: server for {arm.name} up in {time.monotonic() - t0:.1f} s ({' '.join(args)})")

        with ThreadPoolExecutor(max_workers=min(STARTING_AT_ONCE, len(self.o.arms))) as pool:
            for future in [pool.submit(start, arm) for arm in self.o.arms]:
                future.result()  # the first failure raises; run() stops the servers that started

    def stop_servers(self) -> None:
        for server in self.servers.values():
            try:
                server.stop()
            except Exception as exc:  # keep stopping the others
                self.log(f"live: stopping a server: {exc}")

    def run_job(self, index: int, seed: int, arm: Any) -> dict[str, Any]:
        from openai import OpenAI

        from jumpahead.traces.file_names import safe_file_stem

        from .agent import run_task

        task = _task_for(seed, self.o.seeds.index(seed), self.o.kinds)
        session = f"live-{arm.slug}-{seed}"
        trace = self.out / "traces" / arm.slug / f"{safe_file_stem(session)}.jsonl"
        trace.unlink(missing_ok=True)  # a task cut off by an earlier run: its turns must not join this one's
        client = OpenAI(base_url=self.servers[arm.name].url + "/v1", api_key="live", max_retries=0)
        work = Path(tempfile.mkdtemp(prefix=f"live-{arm.slug}-{seed}-"))
        try:
            try:
                hindsight = None
                if getattr(arm, "hindsight", False):
                    from .agent import budget
                    from .oracle import recorded_turns

                    wait_s = 2 * budget(task, self.o.agent)[2] + SERVE_START_TIMEOUT_S
                    ordinary = self.ordinary_record(seed, wait_s)
                    hindsight = recorded_turns(ordinary) if ordinary is not None else []
                record = run_task(client, task, work, arm.name, arm.request_field(), session, arm.oracle,
                                  self.o.agent, hindsight)
                _join_trace(record, trace)
            except Exception as exc:  # the task is still accounted: a failure with its reason
                from .agent import TaskRecord

                record = TaskRecord(arm=arm.name, seed=seed, kind=task.kind, steps=task.steps, session=session,
                                    status="error", error=f"runner: {type(exc).__name__}: {str(exc)[:300]}")
            if self.o.keep_workspaces:
                dest = self.out / "work" / arm.slug / str(seed)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(work, dest, dirs_exist_ok=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            client.close()
        doc = record.to_json()
        doc["job"] = index
        doc["pass"] = self.pass_index
        with self._lock:
            self.records.append(doc)
            with (self.out / "tasks.jsonl").open("a") as fh:
                fh.write(json.dumps(doc) + "\n")
            self.done += 1
            self._recorded.notify_all()
            self.log(f"live: [{self.done}/{len(self.o.seeds) * len(self.o.arms)}] {arm.name} seed {seed} "
                     f"({task.kind}): {'ok' if record.success else record.status} in {record.wall_s:.1f} s, "
                     f"{len(record.turns)} turns")
        return doc

    def _earlier_run(self) -> dict[str, Any]:
        """The `run` section of the summary an earlier pass wrote ({} when none)."""
        try:
            run = json.loads((self.out / "summary.json").read_text())["run"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        return run if isinstance(run, dict) else {}

    def _earlier_wall_s(self) -> float:
        """The run wall time the summary of earlier passes recorded (0 when none)."""
        try:
            return float(self._earlier_run()["wall_s"])
        except (KeyError, ValueError, TypeError):
            return 0.0

    def _resume(self, path: Path) -> set[tuple[str, int]]:
        """Keep the earlier passes' records of whole seeds (every arm of the seed done) and
        return their (arm, seed) jobs. A seed with only some arms done is run again in full
        in this pass: arms are compared by seed, and a seed whose arms ran in different
        passes (another session, another CPU, another load) would compare machines, not
        arms. The records set aside that way go to tasks.partial.jsonl, not lost."""
        names = {a.name for a in self.o.arms}
        kept: dict[tuple[str, int], dict[str, Any]] = {}
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            key = (rec.get("arm"), rec.get("seed"))
            if key[0] in names and key[1] in self.o.seeds and key not in kept:
                kept[key] = rec
        whole = {seed for seed in self.o.seeds if all((name, seed) in kept for name in names)}
        partial = [rec for (arm, seed), rec in kept.items() if seed not in whole]
        if partial:
            with (self.out / PARTIAL).open("a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in partial)
        self.records = [rec for (arm, seed), rec in kept.items() if seed in whole]
        self.log(f"live: resuming, {len(whole)} seeds done in every arm ({len(self.records)} tasks); "
                 f"{len(partial)} tasks of unfinished seeds set aside in {PARTIAL} and run again")
        return {key for key in kept if key[1] in whole}

    def _passes(self) -> list[dict[str, Any]]:
        """The passes before this one (a run made before passes were recorded counts as one)."""
        earlier = self._earlier_run()
        passes = earlier.get("passes")
        if isinstance(passes, list):
            return list(passes)
        if self.records:
            return [{k: earlier.get(k) for k in ("commit", "dirty", "machine", "finished_utc", "wall_s")}]
        return []

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        done: set[tuple[str, int]] = set()
        path = self.out / "tasks.jsonl"
        if self.o.resume and path.exists():
            done = self._resume(path)
        path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        passes = self._passes() if self.o.resume else []
        self.pass_index = len(passes)
        self.done = len(self.records)
        todo = [(i, job) for i, job in enumerate(jobs(self.o.seeds, self.o.arms)) if (job[1].name, job[0]) not in done]
        earlier_s = self._earlier_wall_s() if self.o.resume else 0.0
        started_utc = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        started = time.perf_counter()
        try:
            if todo:
                self.start_servers()
            lock = threading.Lock()

            def worker() -> None:
                while True:
                    with lock:
                        if not todo:
                            return
                        index, (seed, arm) = todo.pop(0)
                    self.run_job(index, seed, arm)

            threads = [threading.Thread(target=worker, name=f"live-{i}") for i in range(max(1, self.o.concurrency))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            self.stop_servers()
        arm_names = [a.name for a in self.o.arms]
        self.records.sort(key=lambda r: r["job"])
        finished_utc = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        this_pass = {**git_commit(), "machine": machine(), "started_utc": started_utc, "finished_utc": finished_utc,
                     "wall_s": round(time.perf_counter() - started, 3),
                     "tasks": sum(1 for r in self.records if r.get("pass", 0) == self.pass_index)}
        run_info = {"tasks_per_arm": len(self.o.seeds), "seeds": self.o.seeds, "kinds": self.o.kinds,
                    "adapter": self.o.adapter, "model": self.o.model, "concurrency": self.o.concurrency,
                    "arms": {a.name: {"serve_args": a.serve_args(), "request": a.request_field(),
                                      "oracle": a.oracle, "hindsight": getattr(a, "hindsight", False)}
                             for a in self.o.arms},
                    "agent": vars(self.o.agent) if self.o.agent is not None else None,
                    "command": self.o.command or equivalent_command(self.o),
                    "command_source": "command line" if self.o.command else "run_live options",
                    "served": next((s for s in self.served.values() if s), None)
                              or self._earlier_run().get("served"),
                    # each arm's server (/health): the drafter it loaded, for --record-drafter
                    "served_by_arm": {a.name: self.served.get(a.name) or
                                      (self._earlier_run().get("served_by_arm") or {}).get(a.name)
                                      for a in self.o.arms},
                    "machine": machine(),
                    **git_commit(),
                    "records": "tasks.jsonl",
                    # each pass of a --resume'd run: its commit, machine and the tasks it ran
                    # (records carry their pass); a seed's arms always ran in one pass
                    "passes": [*passes, this_pass],
                    "finished_utc": finished_utc,
                    # every pass's wall time: a --resume pass adds to the earlier ones
                    "wall_s": round(earlier_s + time.perf_counter() - started, 3)}
        summary = write_outputs(self.out, self.records, arm_names, run_info, self.log)
        return summary


def run_live(options: LiveOptions) -> dict[str, Any]:
    return Run(options).run()


def run(args: argparse.Namespace) -> int:
    from jumpahead.traces.arms import ArmError

    from .arms import parse_live_arms

    try:
        arms = parse_live_arms(args.arms)
    except ArmError as exc:
        print(f"jumpahead live: {exc}", file=sys.stderr)
        return 2
    if args.tasks < 1 or args.concurrency < 1 or args.max_steps < 1 or args.max_tokens < 1:
        print("jumpahead live: --tasks, --concurrency, --max-steps and --max-tokens must be at least 1",
              file=sys.stderr)
        return 2
    if args.record_drafter:
        from .drafter_measurement import check_recordable

        problem = check_recordable([a.name for a in arms], args.seed_split)
        if problem:
            print(f"jumpahead live: --record-drafter: {problem}", file=sys.stderr)
            return 2
    from .world import ALL_KINDS, split_seeds

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else None
    unknown = [k for k in kinds or [] if k not in ALL_KINDS]
    if unknown:
        print(f"jumpahead live: unknown task kind(s) {', '.join(unknown)} (known: {', '.join(ALL_KINDS)})",
              file=sys.stderr)
        return 2
    from .agent import AgentOptions

    seeds = split_seeds(args.seed_split, args.seed_offset + args.tasks)[args.seed_offset:]
    out = Path(args.out) if args.out else Path("live-runs") / time.strftime("%Y%m%d-%H%M%S")
    agent = AgentOptions(max_steps=args.max_steps, max_tokens=args.max_tokens, timeout_s=args.task_timeout,
                         temperature=args.temperature)
    summary = run_live(LiveOptions(arms=arms, seeds=seeds, kinds=kinds, out=out, adapter=args.adapter,
                                   model=args.model, concurrency=args.concurrency, agent=agent,
                                   serve_args=list(args.serve_arg), keep_workspaces=args.keep_workspaces,
                                   resume=args.resume, command=command_line(args, out)))
    table = {arm: {"success": s["success_rate"], "ci95": s["success_ci95"],
                   "wall_s_median": s["wall_s_all"].get("median"), "net_s": s["totals"]["net_s"]}
             for arm, s in summary["per_arm"].items()}
    result: dict[str, Any] = {"out": str(out), "arms": table}
    rc = 0
    if args.record_drafter:
        from .drafter_measurement import DrafterMeasurementError, record_measurement

        try:
            result["drafter_measurement"] = str(record_measurement(summary, args.seed_split))
        except DrafterMeasurementError as exc:
            print(f"jumpahead live: --record-drafter: {exc}", file=sys.stderr)
            rc = 1
    print(json.dumps(result, indent=1))
    return rc
