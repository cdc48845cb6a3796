"""Bad command-line input across commands: a message naming what is wrong, exit code 2 (1 for
a broker that cannot be reached), no traceback, and nothing done before the check."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.cli_support import cli_error
from vigil.daemon.cli import main
from vigil.rules.reach.network import Network


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(0)
    net = Network.from_arrays(
        [(rng.normal(size=(4, 2)), rng.normal(size=4)), (rng.normal(size=(1, 4)), [0.0])],
        output="sigmoid",
    )
    path = tmp_path / "m.onnx"
    path.write_bytes(net.to_onnx())
    np.save(tmp_path / "x.npy", rng.uniform(0, 1, size=(2, 2)))
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lower", "nan"], "feature bounds must be finite numbers with lower <= upper"),
        (["--lower", "2", "--upper", "1"], "feature bounds must be finite numbers"),
        (["--out", "/nonexistent/o.npy"], "no directory /nonexistent to write o.npy in"),
        (["--delta", "0.1", "--gamma", "2"], "--delta, --gamma only apply with --robust"),
    ],
)
def test_explain_checks_bounds_and_output_before_working(capsys, tmp_path, model, args, message):
    code, err = cli_error(
        capsys, ["explain", "--model", str(model), "--x", str(tmp_path / "x.npy"), *args]
    )
    assert code == 2 and message in err


def test_explain_writes_the_output_name_it_was_given(capsys, tmp_path, model):
    out = tmp_path / "found.cfx"
    argv = ["explain", "--model", str(model), "--x", str(tmp_path / "x.npy"), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert np.load(out).shape == (2, 2) and not (tmp_path / "found.cfx.npy").exists()


def test_an_empty_array_file_is_named(capsys, tmp_path, model):
    (tmp_path / "empty.npy").write_bytes(b"")
    code, err = cli_error(
        capsys, ["certify", "cfx", "--model", str(model), "--cfx", str(tmp_path / "empty.npy")]
    )
    assert code == 2 and f"--cfx {tmp_path / 'empty.npy'}: not a .npy array" in err


def test_an_unreachable_broker_is_an_error_not_a_traceback(tmp_path):
    config = tmp_path / "vigil.toml"
    config.write_text(
        '[kafka]\nbootstrap_servers = "127.0.0.1:1"\nstartup_timeout_seconds = 2\n'
        "[metrics]\nenabled = false\n"
        f'[state]\ndir = "{tmp_path / "state"}"\n'
        '[[rules]]\nname = "r"\nkind = "ior"\ntopic = "t"\neps = 0.1\n'
    )
    # in a process of its own: `run` sets up the logging of the process it runs in
    result = subprocess.run(
        [sys.executable, "-m", "vigil.daemon.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(
        "vigil run: error: no broker at 127.0.0.1:1 answered for 2 s "
        "([kafka] startup_timeout_seconds); last attempt: cannot reach the Kafka broker at "
        "127.0.0.1:1: 127.0.0.1:1: "
    ), last
    assert "Traceback" not in result.stderr and "Unclosed" not in result.stderr


@pytest.mark.parametrize("value", ["nan", "-1", "inf"])
def test_replay_refuses_a_ratio_threshold_that_would_hide_every_alert(capsys, tmp_path, value):
    stream = tmp_path / "s.csv"
    stream.write_text("p,a\n0,1\n1,1\n")
    argv = ["replay", str(stream), "--decision-column", "p", "--eps", "1"]
    code, err = cli_error(capsys, [*argv, "--ratio-threshold", value])
    assert code == 2 and "--ratio-threshold: expected a finite number >= 0" in err
