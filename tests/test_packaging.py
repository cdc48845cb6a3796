"""The wheel installs next to the PyPI packages whose import names the folders share.

The repository's folders daemon/ connectors/ rules/ install as vigil.daemon, vigil.connectors
and vigil.rules. This test builds the wheel, installs it into a fresh virtual environment
together with python-daemon (import name ``daemon``) and ``rules`` (import name ``rules``)
from the package index, and checks that each program keeps its own code, that the demo run
from outside the repository prints what it prints inside it, and that uninstalling Vigil
leaves the other two intact.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("daemon", "connectors", "rules")


def _run(args: list, cwd: Path, timeout: float = 600) -> str:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def _demo(vigil: Path, cwd: Path, workdir: Path) -> tuple[list[str], dict]:
    """The demo's summary lines (the workdir's name made neutral) and its JSON line without
    the timing."""
    lines = _run([vigil, "demo", "--workdir", workdir], cwd).strip().splitlines()
    summary = json.loads(lines[-1])
    summary.pop("seconds")
    return [line.replace(str(workdir), "OUT") for line in lines[:-1]], summary


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (a build leaves build/ where it runs)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for name in ("vigil", *FOLDERS):
        shutil.copytree(REPO / name, source / name, ignore=junk)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source], out)
    (found,) = out.glob("vigil_daemon-*.whl")
    return found


def test_the_wheel_holds_only_the_vigil_package_and_every_module(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"vigil", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    modules = {
        f"vigil/{p.relative_to(REPO).as_posix()}"
        for folder in FOLDERS
        for p in (REPO / folder).rglob("*")
        if p.is_file() and p.suffix in (".py", ".json", ".csv") and "__pycache__" not in p.parts
    }
    assert modules - set(names) == set()


def _lend_dependencies(env: Path, into: Path) -> None:
    """Puts this environment's installed packages, except Vigil and the installers, on the
    new environment's path, so pip finds Vigil's requirements met and installs Vigil itself
    (copying numpy, onnxruntime and faiss again took most of a minute)."""
    here = Path(pytest.__file__).parents[1]  # this environment's site-packages
    skip = ("vigil", "__editable__", "pip", "setuptools", "_distutils_hack", "distutils")
    for entry in here.iterdir():
        if not entry.name.startswith(skip) and entry.suffix != ".pth":
            (into / entry.name).symlink_to(entry)
    (site,) = (env / "lib").glob("python*/site-packages")
    (site / "lent.pth").write_text(f"{into}\n")


def test_installs_beside_python_daemon_and_rules(wheel, tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python, bindir = env / "bin" / "python", env / "bin"
    lent = tmp_path / "lent"
    lent.mkdir()
    _lend_dependencies(env, lent)
    _run([python, "-m", "pip", "install", "-q", wheel, "python-daemon", "rules"], tmp_path)

    owners = json.loads(
        _run(
            [
                python,
                "-c",
                "import json, importlib.metadata as m, daemon, rules, vigil;"
                "daemon.DaemonContext; d = m.packages_distributions();"
                "print(json.dumps({k: d[k] for k in ('daemon', 'rules', 'vigil')}))",
            ],
            tmp_path,
        )
    )
    assert owners == {"daemon": ["python-daemon"], "rules": ["rules"], "vigil": ["vigil-daemon"]}

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    inside = _demo(Path(sys.executable).with_name("vigil"), REPO, tmp_path / "in-repo")
    assert _demo(bindir / "vigil", outside, outside / "demo") == inside

    _run([python, "-m", "pip", "uninstall", "-y", "-q", "vigil-daemon"], tmp_path)
    _run([python, "-c", "from daemon import DaemonContext; import rules.predicates"], tmp_path)
