"""The `jumpahead` command line: help is instant (no mlx), bad arguments exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jumpahead.app.cli import COMMANDS, build_parser, main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys\nfrom jumpahead.app.cli import main\n"
        "try:\n    code = main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('MLX_LOADED' if 'mlx.core' in sys.modules else 'NO_MLX')\nsys.exit(code)"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_help_lists_commands_without_loading_mlx():
    out = run_cli("--help")
    assert out.returncode == 0
    assert "serve" in out.stdout and out.stdout.rstrip().endswith("NO_MLX")
    out = run_cli("serve", "--help")
    assert out.returncode == 0 and "--max-batch" in out.stdout and "--model" in out.stdout
    assert out.stdout.rstrip().endswith("NO_MLX")


def test_serve_defaults():
    args = build_parser("serve").parse_args(["serve"])
    assert (args.model, args.host, args.port, args.max_batch, args.log_level) == (None, "127.0.0.1", 8000, 8, "info")


@pytest.mark.parametrize("argv", [[], ["nope"], ["serve", "--max-batch", "0"], ["serve", "--port", "x"],
                                  ["serve", "--log-level", "loud"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_every_command_module_has_the_interface():
    import importlib

    for module, _ in COMMANDS.values():
        mod = importlib.import_module(module)
        assert callable(mod.add_arguments) and callable(mod.run)
