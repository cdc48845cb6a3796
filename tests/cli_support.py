"""Running the ``vigil`` command in tests: as a subprocess, or in-process for its error line."""

from __future__ import annotations

import subprocess
import sys

from vigil.daemon.cli import main


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``vigil ARGS...`` in a fresh interpreter, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "vigil.daemon.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cli_error(capsys, argv: list[str]) -> tuple[int, str]:
    """Exit code and stderr of ``vigil ARGV`` run in-process, which must not be a traceback."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse refuses an argument
        code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err
