"""A non-editable install works (issue 38): the wheel holds every module and data file of
the source tree, and `jumpahead serve` from a fresh venv answers a chat completion.

The tree (what git lists: tracked or not ignored) is copied to tmp_path and built there
(`pip wheel --no-build-isolation`, offline, with this venv's setuptools), so the build
neither reads stale build/ output nor writes into the checkout. The wheel goes into a
fresh venv made in tmp_path, with no pip and no source tree on its path; a .pth file
there appends this venv's site-packages for the dependencies. A path line in a .pth is
not itself processed as a site dir, so this venv's .pth files, the editable jumpahead's
finder among them, stay inactive: `jumpahead` resolves to the wheel's copy, which the
test asserts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import httpx

from jumpahead.live.server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("core", "app", "proxy", "engine", "policies", "traces", "bench", "live", "training", "research")  # each is jumpahead.<folder>


def _listed_files() -> list[str]:
    """The checkout's files, relative to ROOT: those git tracks or does not ignore, less
    deleted ones (every file, less __pycache__ and build outputs, outside git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout.decode()
        return sorted(f for f in out.split("\0") if f and (ROOT / f).is_file())
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis"}
        return sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                      if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts)
                      and not p.name.endswith(".pyc") and ".egg-info" not in str(p))


def _package_files(files: list[str]) -> list[str]:
    """The files under the package folders that an install must carry (tests excluded)."""
    return [f for f in files if f.split("/")[0] in FOLDERS and "tests" not in f.split("/")[:-1]
            and "__pycache__" not in f.split("/") and not f.endswith(".pyc")]


def _module_names(files: list[str]) -> list[str]:
    names = []
    for f in files:
        if f.endswith(".py"):
            parts = f.removesuffix(".py").split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(["jumpahead", *parts]))
    return names


def _run(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, f"{cmd} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def test_wheel_installs_every_package_and_serves(tmp_path):
    files = _listed_files()
    package_files = _package_files(files)
    assert "engine/strict/tool_formats/__init__.py" in package_files  # the one issue 38 found missing
    top_packages = {f.split("/")[0] for f in files if f.count("/") == 1 and f.endswith("/__init__.py")}
    assert top_packages - {"tests"} == set(FOLDERS), "a top-level package folder setup.py does not install"

    # Build the wheel from a copy of the tree.
    src = tmp_path / "src"
    for f in files:
        if not f.startswith("tests/"):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PYTHONPATH="", PYTHONNOUSERSITE="1")  # set, not only left out: ServerProcess adds env to os.environ
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", tmp_path / "dist", src], cwd=tmp_path, env=env)
    (wheel,) = (tmp_path / "dist").glob("jumpahead-*.whl")

    # The wheel holds exactly the tree's package files, each under jumpahead/.
    with zipfile.ZipFile(wheel) as z:
        in_wheel = {n for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
        entry_points = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    expected = {f"jumpahead/{f}" for f in package_files}
    assert not sorted(expected - in_wheel), f"missing from the wheel: {sorted(expected - in_wheel)}"
    assert not sorted(in_wheel - expected), f"in the wheel but not in the tree: {sorted(in_wheel - expected)}"
    assert "jumpahead = jumpahead.app.cli:main" in entry_points

    # A fresh venv with the wheel; this venv's site-packages appended for the dependencies.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel],
         cwd=tmp_path, env=env)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path, env=env).strip())
    deps = sysconfig.get_paths()["purelib"]
    (site / "_test_deps.pth").write_text(deps + "\n")

    # Every module of the tree imports from the installed wheel.
    modules = _module_names(package_files)
    probe = ("import importlib, json, sys, traceback\n"
             "import jumpahead.engine\n"
             "failed = {}\n"
             "for name in json.loads(sys.argv[1]):\n"
             "    try:\n"
             "        importlib.import_module(name)\n"
             "    except Exception:\n"
             "        failed[name] = traceback.format_exc(limit=3)\n"
             "print(json.dumps({'engine': jumpahead.engine.__file__, 'failed': failed,\n"
             "                  'path': list(jumpahead.__path__)}))\n")
    report = json.loads(_run([python, "-c", probe, json.dumps(modules)], cwd=tmp_path, env=env).splitlines()[-1])
    assert Path(report["engine"]).resolve().is_relative_to(site.resolve()), report["engine"]
    assert Path(report["path"][0]).resolve() == (site / "jumpahead").resolve(), report["path"]
    assert not report["failed"], "\n".join(f"{k}:\n{v}" for k, v in report["failed"].items())

    # The installed console script serves the default model and answers a chat completion.
    server = ServerProcess(["--max-batch", "2", "--log-level", "warning", "--no-ssd-cache"],
                           tmp_path / "serve.log", cwd=tmp_path, env=env, wait=False,
                           command=[str(env_dir / "bin" / "jumpahead"), "serve"])
    try:
        url = server.wait_healthy(timeout=600)
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["status"] == "ok", health
        if health.get("drafter"):  # the shipped drafter (engine/weights/drafters), where serve runs it by default
            assert Path(health["drafter"]).resolve().is_relative_to(site.resolve()), health["drafter"]
        page = httpx.get(f"{url}/dashboard", timeout=30)  # proxy/static, read at run time
        assert page.status_code == 200 and "<html" in page.text.lower(), page.text[:300]
        r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
            "model": "local", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hi"}]})
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert (message.get("content") or "").strip() or message.get("tool_calls"), r.json()
    finally:
        server.stop()
