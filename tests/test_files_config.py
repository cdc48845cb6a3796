"""A [files] source whose decisions file is missing is a configuration error (named, exit 2,
nothing written), and ops/examples/demo-files.toml runs after its documented preparation."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from vigil.connectors.files import JsonLinesSource, SourceFileError
from vigil.daemon.config import parse_config
from vigil.daemon.service import run_daemon

VIGIL = Path(sys.executable).with_name("vigil")
EXAMPLE = Path(__file__).resolve().parents[1] / "ops" / "examples" / "demo-files.toml"

CONFIG = """
[files]
decisions = "{decisions}"
topic = "decisions"
[outputs]
alerts_file = "out/alerts.jsonl"
dead_letter_file = "out/dead-letters.jsonl"
[metrics]
enabled = false
[state]
dir = "state"
[[rules]]
name = "r"
kind = "ior"
topic = "decisions"
eps = 0.1
"""


def vigil(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VIGIL), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("command", [["check-config"], ["run", "--config"]])
def test_a_missing_decisions_file_is_a_named_config_error_and_writes_nothing(tmp_path, command):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "vigil.toml").write_text(CONFIG.format(decisions="in/decisions.jsonl"))
    before = _tree(tmp_path)
    result = vigil(*command, "conf/vigil.toml", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    (message,) = [line for line in result.stderr.splitlines() if "files.decisions" in line]
    assert "no such file: conf/in/decisions.jsonl" in message  # resolved from the file's folder
    assert _tree(tmp_path) == before


def test_a_directory_is_not_a_decisions_file(tmp_path):
    (tmp_path / "decisions.jsonl").mkdir()
    (tmp_path / "vigil.toml").write_text(CONFIG.format(decisions="decisions.jsonl"))
    result = vigil("check-config", "vigil.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert "files.decisions: is not a file" in result.stderr


def test_the_daemon_creates_no_output_before_its_source_opens(tmp_path):
    """parse_config (used by `vigil demo`, where the file is written after the configuration)
    does not look for the file; the source does, before the sink creates its files."""
    config = parse_config(
        {
            "files": {"decisions": str(tmp_path / "gone.jsonl"), "topic": "decisions"},
            "outputs": {
                "alerts_file": str(tmp_path / "out" / "alerts.jsonl"),
                "dead_letter_file": str(tmp_path / "out" / "dead-letters.jsonl"),
            },
            "metrics": {"enabled": False},
            "state": {"dir": str(tmp_path / "state")},
            "rules": [{"name": "r", "kind": "ior", "topic": "decisions", "eps": 0.1}],
        }
    )
    with pytest.raises(SourceFileError, match=r"decisions file .*gone\.jsonl: no such file"):
        asyncio.run(run_daemon(config, until_idle=True))
    assert _tree(tmp_path) == []
    assert issubclass(SourceFileError, ValueError)  # the CLI reports it with exit code 2
    with pytest.raises(SourceFileError, match="is not a file"):
        JsonLinesSource(tmp_path, "decisions", tmp_path / "offsets.json")


def test_the_files_example_runs_after_its_preparation_step(tmp_path):
    """In a copy laid out like the repository: check-config names the missing file, then
    `vigil demo --workdir vigil-demo` (the step the example's comments give) makes it
    usable, and the daemon finds the demo's alerts, writing only under vigil-demo/."""
    examples = tmp_path / "ops" / "examples"
    examples.mkdir(parents=True)
    shutil.copy(EXAMPLE, examples / EXAMPLE.name)
    config = f"ops/examples/{EXAMPLE.name}"
    fresh = vigil("check-config", config, cwd=tmp_path)
    assert fresh.returncode == 2 and "files.decisions" in fresh.stderr, fresh.stderr
    assert "vigil-demo/decisions.jsonl" in fresh.stderr

    assert vigil("demo", "--workdir", "vigil-demo", cwd=tmp_path).returncode == 0
    checked = vigil("check-config", config, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    decisions = len((tmp_path / "vigil-demo" / "decisions.jsonl").read_bytes().splitlines())

    out = tmp_path / "vigil-demo" / "state" / "demo-files"
    proc = subprocess.Popen(
        [str(VIGIL), "run", "--config", config],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while _committed(out / "file-offsets.json") != decisions:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the daemon did not read the whole file"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()

    def witnesses(path: Path) -> dict[int, list[int]]:
        alerts = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        return {a["decision"]["id"]: [w["id"] for w in a["witnesses"]] for a in alerts}

    found = witnesses(out / "alerts.jsonl")
    assert found and found == witnesses(tmp_path / "vigil-demo" / "alerts.jsonl")
    assert (out / "dead-letters.jsonl").read_bytes() == b""
    assert _tree(examples) == [EXAMPLE.name]  # nothing written beside the configuration
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops", "vigil-demo"]


def _committed(offsets: Path) -> int | None:
    try:
        return json.loads(offsets.read_text())["offset"]
    except (FileNotFoundError, ValueError):
        return None
