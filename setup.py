"""Which packages and data files the build installs (everything else is in pyproject.toml).

Why a setup.py: the source keeps its packages as top-level folders (core/, engine/, ...)
that install as `jumpahead.<folder>` under the `jumpahead` namespace. pyproject's
`packages.find` cannot put a prefix in front of the names it finds, so it was a
hand-kept list of packages and package-data globs, which forgot new subpackages and
data folders (issue 38: jumpahead.engine.strict.tool_formats was missing from every wheel).
This walks the folders instead: every folder below them holding files is a package
(folders of data without __init__.py too, as setuptools recommends for data; a folder
whose name is no identifier, like weights/drafters/smollm2-135m, goes in as data of the
package above it), and every non-.py file is package data. In a git checkout the files are the ones git lists
(tracked or not ignored: .gitignore keeps training outputs and __pycache__ out);
elsewhere (an unpacked sdist, a copy) every file, less __pycache__ and *.pyc.
Folders named tests are left out. tests/test_wheel_install.py checks the wheel against
the tree.
"""

from __future__ import annotations

import os
import subprocess
from collections import defaultdict
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
FOLDERS = ("core", "app", "proxy", "engine", "policies", "traces", "bench", "live", "training", "research")
NAMESPACE = "jumpahead"
SKIP_DIRS = {"__pycache__", "tests"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def _git_files() -> list[str] | None:
    """Files under FOLDERS that git tracks or does not ignore, relative to ROOT (None
    outside a git checkout of this tree, or without git)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        if Path(top).resolve() != ROOT:
            return None
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              "--", *FOLDERS], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]  # not deleted ones


def _walked_files() -> list[str]:
    files = []
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(ROOT / folder):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            files += [(Path(dirpath) / f).relative_to(ROOT).as_posix() for f in filenames]
    return files


def source_files() -> list[str]:
    """The files the wheel installs, as paths relative to ROOT ('/'-separated)."""
    files = _git_files()
    if files is None:
        files = _walked_files()
    return sorted(f for f in files
                  if not SKIP_DIRS.intersection(f.split("/")[:-1]) and not f.endswith(SKIP_SUFFIXES))


def layout() -> tuple[list[str], dict[str, str], dict[str, list[str]]]:
    """(packages, package_dir, package_data) for setup(). A folder whose name is no Python
    identifier (engine/weights/drafters/smollm2-135m) is no package: its files are data of the
    nearest folder above it that is one, by their path from there."""
    package_data: dict[str, list[str]] = defaultdict(list)
    packages = {f"{NAMESPACE}.{folder}" for folder in FOLDERS}
    for f in source_files():
        *dirs, name = f.split("/")
        depth = next((i for i, d in enumerate(dirs) if not d.isidentifier()), len(dirs))
        packages.update(".".join([NAMESPACE, *dirs[:i]]) for i in range(1, depth + 1))
        if not name.endswith(".py") or depth < len(dirs):
            package_data[".".join([NAMESPACE, *dirs[:depth]])].append("/".join([*dirs[depth:], name]))
    package_dir = {f"{NAMESPACE}.{folder}": folder for folder in FOLDERS}
    return sorted(packages), package_dir, {k: sorted(v) for k, v in package_data.items()}


if __name__ == "__main__":
    packages, package_dir, package_data = layout()
    setup(packages=packages, package_dir=package_dir, package_data=package_data,
          include_package_data=False)
