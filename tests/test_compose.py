"""The ops pack: ops/compose.yaml, the files it mounts and builds from, its configs, the
demo producer and the local example config ops/examples/dev-kafka.toml.

`docker compose config` validates the compose file when a Compose CLI is installed. The
other checks always run and read the compose file's text with a small indentation-based
reader (PyYAML is not a dependency), so they fail when a mounted file moves, a config stops
passing `vigil check-config`, or the services stop agreeing on addresses, ports and topics.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OPS = REPO / "ops"
COMPOSE = OPS / "compose.yaml"
DEV_EXAMPLE = OPS / "examples" / "dev-kafka.toml"
PRODUCER = OPS / "demo-producer.py"
PORT_VARIABLES = ("VIGIL_KAFKA_PORT", "VIGIL_METRICS_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT")


# -- a reader for the block-style YAML of ops/compose.yaml -----------------------------------------


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _content(text: str) -> list[str]:
    """The lines that are neither blank nor comments."""
    return [line for line in text.splitlines() if line.strip() and line.lstrip()[0] != "#"]


def _scalar(text: str):
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)  # the file's flow lists are written as JSON
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


class Node:
    """A mapping key's inline value and the lines nested under it."""

    def __init__(self, value, lines: list[str]) -> None:
        self.value, self.lines = value, lines

    def mapping(self) -> dict[str, Node]:
        if not self.lines:
            return {}
        indent = min(_indent(line) for line in self.lines)
        out: dict[str, Node] = {}
        key = None
        for line in self.lines:
            if _indent(line) == indent:
                match = re.fullmatch(r"\"?([^\":]+)\"?:(?:\s+(.*))?", line.strip())
                assert match, f"{COMPOSE}: expected `key: value`, got {line!r}"
                key = match.group(1)
                out[key] = Node(_scalar(match.group(2) or ""), [])
            else:
                out[key].lines.append(line)
        return out

    def items(self) -> list:
        """A block list's items (only their first lines), or the inline flow list."""
        if isinstance(self.value, list):
            return self.value
        if not self.lines:
            return []
        indent = min(_indent(line) for line in self.lines)
        return [
            _scalar(line.strip()[2:])
            for line in self.lines
            if _indent(line) == indent and line.strip().startswith("- ")
        ]

    def __getitem__(self, key: str) -> Node:
        return self.mapping()[key]


def compose() -> Node:
    return Node("", _content(COMPOSE.read_text()))


def services() -> dict[str, Node]:
    return compose()["services"].mapping()


def binds(service: Node) -> dict[str, Path]:
    """The service's bind mounts: container path -> file or directory in the repository."""
    out = {}
    for volume in service["volumes"].items() if "volumes" in service.mapping() else []:
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            out[target] = (COMPOSE.parent / source).resolve()
    return out


def vigil_cli() -> Path:
    """The `vigil` console script of the interpreter running the tests."""
    script = Path(sys.executable).parent / ("vigil.exe" if os.name == "nt" else "vigil")
    if not script.exists():
        pytest.skip(f"no vigil console script next to {sys.executable}: pip install -e .")
    return script


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(vigil_cli()), "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) or `docker-compose` (v1), whichever answers."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cli in candidates:
        try:
            done = subprocess.run([*cli, "version"], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return cli
    return None


def load_producer():
    spec = importlib.util.spec_from_file_location("vigil_demo_producer", PRODUCER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mounted_vigil_config() -> Path:
    """The config file the vigil service runs, as a path in the repository."""
    vigil = services()["vigil"]
    command = vigil["command"].items()
    target = command[command.index("--config") + 1]
    return binds(vigil)[target]


# -- docker compose config -------------------------------------------------------------------------


def test_compose_config_validates():
    cli = compose_cli()
    if cli is None:
        pytest.skip(
            "no Compose CLI to validate ops/compose.yaml: install Docker with its compose "
            "plugin (`docker compose`), or `apt-get install docker-compose`; validation needs "
            "no Docker daemon"
        )
    env = {k: v for k, v in os.environ.items() if k not in PORT_VARIABLES}
    done = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    if cli == ["docker", "compose"]:  # v2 prints JSON, v1 only YAML
        ports = dict(zip(PORT_VARIABLES, ("19092", "19464", "19090", "13000"), strict=True))
        done = subprocess.run(
            [*cli, "-f", str(COMPOSE), "config", "--format", "json"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**env, **ports},
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        published = {
            (p["host_ip"], str(p["published"]))
            for service in json.loads(done.stdout)["services"].values()
            for p in service.get("ports", [])
        }
        assert published == {("127.0.0.1", port) for port in ports.values()}


# -- structure of the pack -------------------------------------------------------------------------


def test_the_pack_has_its_services():
    assert set(services()) >= {"kafka", "vigil", "demo-producer", "prometheus", "grafana"}


def test_every_mounted_or_built_file_exists():
    declared = set(compose()["volumes"].mapping()) if "volumes" in compose().mapping() else set()
    for name, service in services().items():
        for target, source in binds(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"
            assert source.is_relative_to(REPO), f"{name}: {source} is outside the repository"
        for volume in service["volumes"].items() if "volumes" in service.mapping() else []:
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name}: named volume {source} is not declared"
        if "build" in service.mapping():
            build = service["build"].mapping()
            context = (COMPOSE.parent / build["context"].value).resolve()
            dockerfile = context / build.get("dockerfile", Node("Dockerfile", [])).value
            assert context == REPO, f"{name}: builds from {context}, not the repository root"
            assert dockerfile.is_file(), f"{name}: {dockerfile} is missing"


def test_the_image_runs_vigil_and_leaves_local_files_out():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile, re.M)
    assert re.search(r"\bpip install '\.\[dask\]'", dockerfile)  # the dask engine works in it
    assert re.search(r'^ENTRYPOINT \["vigil"\]', dockerfile, re.M)
    ignored = set(_content((REPO / ".dockerignore").read_text()))
    assert {".venv", ".git"} <= ignored


def _published(port: str) -> tuple[str, str, str]:
    """(host address, host port, container port) of a `ports:` entry."""
    match = re.fullmatch(r"([\d.]+):(\$\{[A-Z_]+:-\d+\}|\d+):(\d+)", port)
    assert match, f"port {port!r} is not HOST_IP:HOST_PORT:CONTAINER_PORT"
    return match.group(1), match.group(2), match.group(3)


def test_published_ports_are_loopback_and_configurable():
    seen = set()
    for name, service in services().items():
        for port in service["ports"].items() if "ports" in service.mapping() else []:
            address, host_port, _ = _published(port)
            assert address == "127.0.0.1", f"{name}: {port!r} is not bound to loopback"
            variable = re.fullmatch(r"\$\{([A-Z_]+):-\d+\}", host_port)
            assert variable, f"{name}: host port of {port!r} is not ${{VARIABLE:-default}}"
            seen.add(variable.group(1))
    assert seen == set(PORT_VARIABLES)


def test_kafka_advertises_a_listener_to_containers_and_one_to_the_host():
    kafka = services()["kafka"]
    env = {k: v.value for k, v in kafka["environment"].mapping().items()}
    advertised = dict(entry.split("://") for entry in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    listeners = dict(entry.split("://") for entry in env["KAFKA_LISTENERS"].split(","))
    (port,) = kafka["ports"].items()
    _, host_port, container_port = _published(port)
    host_listeners = [name for name, address in advertised.items() if address.startswith("127.")]
    assert len(host_listeners) == 1
    (host,) = host_listeners
    # the host listener is the published one, and advertises the published host port
    assert listeners[host].rsplit(":", 1)[1] == container_port
    assert advertised[host] == f"127.0.0.1:{host_port}"
    # containers reach the other one by the service name
    internal = f"kafka:{listeners[env['KAFKA_INTER_BROKER_LISTENER_NAME']].rsplit(':', 1)[1]}"
    assert advertised[env["KAFKA_INTER_BROKER_LISTENER_NAME"]] == internal
    config = tomllib.loads(mounted_vigil_config().read_text())
    assert config["kafka"]["bootstrap_servers"] == internal
    producer = services()["demo-producer"]["command"].items()
    assert producer[producer.index("--bootstrap") + 1] == internal


def test_the_vigil_service_config_passes_check_config():
    path = mounted_vigil_config()
    done = check_config(path)
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout


def test_the_vigil_service_serves_metrics_where_prometheus_scrapes():
    vigil = services()["vigil"]
    config = tomllib.loads(mounted_vigil_config().read_text())
    metrics = config["metrics"]
    assert metrics.get("host") == "0.0.0.0" and metrics.get("enabled", True)
    (port,) = vigil["ports"].items()
    assert port.rsplit(":", 1)[1] == str(metrics.get("port", 9464))
    prometheus = binds(services()["prometheus"])
    scrape = prometheus["/etc/prometheus/prometheus.yml"].read_text()
    assert re.search(r"job_name:\s*vigil\s*$", scrape, re.M), "the rules select job=vigil"
    assert f'"vigil:{metrics.get("port", 9464)}"' in scrape


def test_prometheus_loads_the_packs_alerting_rules():
    mounts = binds(services()["prometheus"])
    targets = [t for t, source in mounts.items() if source == OPS / "prometheus" / "alerts.yml"]
    assert len(targets) == 1, "ops/prometheus/alerts.yml is not mounted into prometheus"
    config = mounts["/etc/prometheus/prometheus.yml"].read_text()
    rule_files = re.search(r"^rule_files:\s*\n((?:\s+-.*\n)+)", config, re.M)
    assert rule_files, "no rule_files in the compose Prometheus config"
    listed = [_scalar(line.strip()[2:]) for line in rule_files.group(1).splitlines()]
    assert listed == targets


def test_grafana_provisions_the_dashboard_and_its_data_source():
    grafana = services()["grafana"]
    mounts = binds(grafana)
    providers = mounts["/etc/grafana/provisioning/dashboards"]
    paths = re.findall(r"^\s+path:\s*(\S+)\s*$", "\n".join(_content(_read_all(providers))), re.M)
    assert paths, "no dashboard provider with a path"
    dashboards = {
        source
        for target, source in mounts.items()
        for path in paths
        if target.startswith(path.rstrip("/") + "/") and target.endswith(".json")
    }
    assert dashboards == {OPS / "grafana" / "vigil-dashboard.json"}

    sources = "\n".join(_content(_read_all(mounts["/etc/grafana/provisioning/datasources"])))
    assert re.search(r"^\s+type:\s*prometheus\s*$", sources, re.M)
    assert re.search(r"^\s+isDefault:\s*true\s*$", sources, re.M)
    url = re.search(r"^\s+url:\s*http://([\w-]+):(\d+)\s*$", sources, re.M)
    assert url and url.group(1) in services()
    (port,) = services()[url.group(1)]["ports"].items()
    assert port.rsplit(":", 1)[1] == url.group(2)

    # the dashboard reaches Prometheus through its DS_PROMETHEUS variable, which picks the
    # default Prometheus data source: the provisioned one
    dashboard = json.loads((OPS / "grafana" / "vigil-dashboard.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    refs = {
        (d.get("type"), d.get("uid"))
        for d in _datasources(dashboard)
        if isinstance(d, dict) and d.get("type") != "grafana"
    }
    assert refs == {("prometheus", "${DS_PROMETHEUS}")}


def _read_all(path: Path) -> str:
    files = sorted(path.glob("*.y*ml")) if path.is_dir() else [path]
    assert files, f"{path} holds no provisioning file"
    return "\n".join(f.read_text() for f in files)


def _datasources(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            else:
                yield from _datasources(value)
    elif isinstance(node, list):
        for value in node:
            yield from _datasources(value)


def test_the_demo_producer_feeds_the_topic_the_rules_read():
    producer = services()["demo-producer"]
    assert binds(producer)[producer["entrypoint"].items()[1]] == PRODUCER
    args = producer["command"].items()
    topic = args[args.index("--topic") + 1]
    rules = tomllib.loads(mounted_vigil_config().read_text())["rules"]
    assert {rule["topic"] for rule in rules} == {topic}
    assert {rule["model"] for rule in rules} == {"compas"}


def test_the_stack_runs_the_rules_of_the_local_example():
    stack = tomllib.loads(mounted_vigil_config().read_text())["rules"]
    local = tomllib.loads(DEV_EXAMPLE.read_text())["rules"]
    assert stack == local


# -- the demo producer -----------------------------------------------------------------------------


def test_demo_producer_help_and_defaults(capsys):
    producer = load_producer()
    with pytest.raises(SystemExit) as done:
        producer.main(["--help"])
    assert done.value.code == 0
    assert "--rate" in capsys.readouterr().out
    defaults = producer.build_parser().parse_args([])
    config = tomllib.loads(DEV_EXAMPLE.read_text())
    assert {rule["topic"] for rule in config["rules"]} == {defaults.topic}
    assert defaults.bootstrap == config["kafka"]["bootstrap_servers"]


def test_demo_producer_events_are_the_bundled_stream_keyed_by_model():
    producer = load_producer()
    events = producer.bundled_events("compas")
    rows = producer.bundled_stream().read_text().splitlines()
    assert len(events) == len(rows) - 1
    key, value = events[0]
    event = json.loads(value)
    assert key == b"compas" and set(event) == {"id", "model", "x", "y"}
    assert event["model"] == "compas" and len(event["x"]) == 14


def test_demo_producer_refuses_a_bad_events_file(tmp_path, capsys):
    producer = load_producer()
    path = tmp_path / "decisions.jsonl"
    path.write_text('{"id": 1, "x": [0.5], "y": 1}\n')
    assert producer.main(["--events", str(path), "--wait", "0"]) == 2
    assert "model" in capsys.readouterr().err
    path.write_text("not json\n")
    assert producer.main(["--events", str(path), "--wait", "0"]) == 2


# -- ops/examples/dev-kafka.toml -------------------------------------------------------------------


def test_dev_example_passes_check_config_on_a_fresh_checkout(tmp_path):
    """Copied where no state directory exists yet, as after a clone."""
    copy = tmp_path / "ops" / "examples" / DEV_EXAMPLE.name
    copy.parent.mkdir(parents=True)
    shutil.copy(DEV_EXAMPLE, copy)
    done = check_config(copy)
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout and "kafka source" in done.stdout
    assert sorted(p.name for p in copy.parent.iterdir()) == [DEV_EXAMPLE.name]


def test_dev_example_targets_the_dev_broker_and_ignores_its_state():
    config = tomllib.loads(DEV_EXAMPLE.read_text())
    assert config["kafka"]["bootstrap_servers"] == "127.0.0.1:9092"
    assert config["kafka"]["exactly_once"] is True
    assert config["metrics"]["host"] == "127.0.0.1" and config["metrics"]["port"] == 9464
    state = Path(config["state"]["dir"])
    assert not state.is_absolute()
    relative = (DEV_EXAMPLE.parent / state).resolve().relative_to(REPO).as_posix()
    ignored = {line.strip().strip("/") for line in _content((REPO / ".gitignore").read_text())}
    assert relative in ignored, f"{relative} is not in .gitignore"
