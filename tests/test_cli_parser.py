"""The command line builds only the parser of the command it names, so a command starts
without the libraries of the others."""

from __future__ import annotations

import argparse
import os
import pkgutil
import subprocess
import sys

import vigil.daemon.cli as cli


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple]:
    out: list[tuple] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, (*prefix, name)) or [(*prefix, name)]
    return out


def test_every_command_line_finds_its_module():
    modules = {i.name for i in pkgutil.iter_modules(cli.__path__) if not i.name.startswith("_")}
    commands = _commands(cli.build_parser([]))
    assert len(commands) == len(modules)
    for command in commands:
        named = cli._named(list(command))
        assert named in modules, command
        alone = _commands(cli.build_parser([*command, "--help"]))
        assert [c for c in alone if c[0] not in cli.GROUPS or len(c) > 1] == [command]


def test_verify_vnnlib_starts_without_the_daemons_libraries():
    probe = (
        "import sys; from vigil.daemon.cli import build_parser; "
        "build_parser(['verify', 'vnnlib']); "
        "print(sorted(m for m in ('aiokafka', 'dd', 'faiss', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _exiting(code: int, before: str = "pass") -> subprocess.Popen:
    """A process that runs ``before``, prints a line into its (block-buffered) stdout pipe,
    waits for a line on stdin, then ends through ``exit_now(code)``."""
    program = (
        f"import sys; from vigil.daemon.cli import exit_now; {before}; "
        f"print('result'); sys.stdin.readline(); exit_now({code})"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.Popen(
        [sys.executable, "-c", program],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def test_a_one_shot_command_flushes_its_output_before_it_ends():
    child = _exiting(3)
    out, _ = child.communicate(b"go\n", timeout=60)
    assert (child.returncode, out) == (3, b"result\n")


def test_a_one_shot_command_whose_output_is_lost_says_so_in_its_exit_code():
    child = _exiting(0)
    child.stdout.close()  # nobody reads: the final flush fails
    child.stdin.write(b"go\n")
    child.stdin.close()
    assert child.wait(timeout=60) == 120


def test_a_one_shot_command_under_a_profiler_exits_as_usual():
    """A profiler or coverage writes its data at exit: the teardown is kept for them."""
    before = "import atexit; atexit.register(print, 'written'); sys.setprofile(lambda *a: None)"
    child = _exiting(4, before)
    out, _ = child.communicate(b"go\n", timeout=60)
    assert (child.returncode, out) == (4, b"result\nwritten\n")
