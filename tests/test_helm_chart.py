"""The Helm chart in ops/helm/vigil, checked as far as no cluster can: `helm lint --strict`
and `helm template` for several values sets at three Kubernetes versions, every built-in
object against that version's strict schemas, the custom resources against their CRDs'
schemas, the cross-references between objects, the alert rules with promtool, the rendered
vigil.toml with `vigil check-config`, and the pod's command line against the dev broker.

`make test` brings the pinned helm (`ops/helm/get.sh helm`, which builds it with Go) and the
CRD schemas (`ops/helm/get.sh crd-models`, with npm) and passes their paths in VIGIL_HELM and
VIGIL_CRD_MODELS; without them those tests skip.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.daemon_harness import free_port

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "ops" / "helm" / "vigil"
ALERTS = REPO / "ops" / "prometheus" / "alerts.yml"
ALERT_TESTS = REPO / "ops" / "prometheus" / "alerts_test.yml"
DASHBOARD = REPO / "ops" / "grafana" / "vigil-dashboard.json"
KUBE_VERSIONS = ("1.29.0", "1.31.0", "1.33.0")
NAMESPACE = "models"
RELEASE = "audit"
FULLNAME = "audit-vigil"

EVERYTHING = {
    "replicaCount": 3,
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Vigil"}},
    "podDisruptionBudget": {"enabled": True},
    "keda": {"enabled": True, "lagThreshold": 5000, "maxReplicaCount": 6},
    "config": {
        "kafka": {"bootstrap_servers": "kafka:9092", "group_id": "vigil-audit"},
        "seldon": {"namespace": "seldon-mesh"},
        "rules": [
            {"name": "iris", "kind": "ior", "format": "seldon", "model": "iris", "eps": 0.1},
            {"name": "credit", "kind": "ior", "topic": "ml.decisions", "eps": 0.05, "dim": 4},
        ],
    },
}
SASL = {
    "kafkaSecret": {"name": "kafka-creds", "saslPasswordKey": "password", "caKey": "ca.crt"},
    "keda": {"enabled": True},
    "config": {
        "kafka": {
            "bootstrap_servers": "kafka:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "vigil",
        }
    },
}
MTLS = {
    "kafkaSecret": {
        "name": "kafka-tls",
        "caKey": "ca.crt",
        "certKey": "tls.crt",
        "keyKey": "tls.key",
    },
    "keda": {"enabled": True},
    "config": {"kafka": {"bootstrap_servers": "kafka:9093", "security_protocol": "SSL"}},
}
EXAMPLES = CHART.parent / "examples"
VALUES = {
    "defaults": {},
    "everything": EVERYTHING,
    "file-store": {"config": {"state": {"store": "file"}}, "persistence": {"size": "20Gi"}},
    "sasl": SASL,
    "mtls": MTLS,
    # the examples docs/operations.md installs
    "seldon-example": yaml.safe_load((EXAMPLES / "seldon.yaml").read_text()),
    "kserve-example": yaml.safe_load((EXAMPLES / "kserve.yaml").read_text()),
}


def _helm_binary() -> str:
    helm = os.environ.get("VIGIL_HELM") or shutil.which("helm")
    if not helm or not os.path.exists(helm):
        pytest.skip("helm not found: `bash ops/helm/get.sh helm` builds it (needs Go)")
    return helm


@pytest.fixture(scope="module")
def helm() -> str:
    return _helm_binary()


def _values_file(values: dict, directory: Path) -> Path:
    path = directory / f"values-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(values))  # JSON is YAML
    return path


def _run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


def render_values(helm: str, values: dict, directory: Path, kube: str = "1.31.0") -> list[dict]:
    """The objects `helm template` renders for ``values``; fails the test on an error."""
    result = _run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        kube,
        "-f",
        str(_values_file(values, directory)),
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(helm: str, values: dict, directory: Path) -> str:
    """The error `helm template` stops with for ``values``."""
    result = _run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        "1.31.0",
        "-f",
        str(_values_file(values, directory)),
    )
    assert result.returncode != 0, f"rendered, but should not have:\n{result.stdout[:2000]}"
    return result.stderr


@pytest.fixture(scope="module")
def rendered(helm, tmp_path_factory) -> dict[tuple[str, str], list[dict]]:
    directory = tmp_path_factory.mktemp("helm-values")
    return {
        (name, kube): render_values(helm, values, directory, kube)
        for name, values in VALUES.items()
        for kube in KUBE_VERSIONS
    }


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}"
    return found[0]


def kinds(objects: list[dict]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def container(objects: list[dict]) -> dict:
    (vigil,) = one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    return vigil


def vigil_toml(objects: list[dict]) -> dict:
    return tomllib.loads(one(objects, "ConfigMap", FULLNAME)["data"]["vigil.toml"])


CUSTOM_GROUPS = ("monitoring.coreos.com/", "keda.sh/")


def custom(o: dict) -> bool:
    return o["apiVersion"].startswith(CUSTOM_GROUPS)


# -- lint, render, schemas ------------------------------------------------------------------------


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("name", VALUES)
def test_helm_lint_strict(helm, tmp_path, name, kube):
    result = _run_helm(
        helm,
        "lint",
        "--strict",
        str(CHART),
        "--kube-version",
        kube,
        "-f",
        str(_values_file(VALUES[name], tmp_path)),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("name", VALUES)
def test_every_built_in_object_is_valid_in_strict_mode(rendered, name, kube):
    objects = [o for o in rendered[name, kube] if not custom(o)]
    assert {"StatefulSet", "ConfigMap", "Service", "ServiceAccount"} <= set(kinds(objects))
    for o in objects:
        # raises ValidationError naming the field (strict: unknown fields are errors)
        kubernetes_validate.validate(o, kube, strict=True)


def test_strict_validation_catches_an_unknown_field(rendered):
    """The check above can fail: a misspelt probe field is refused."""
    statefulset = copy.deepcopy(one(rendered["defaults", "1.31.0"], "StatefulSet"))
    pod = statefulset["spec"]["template"]["spec"]
    pod["containers"][0]["readinessProbe"]["periodSecond"] = 10
    with pytest.raises(kubernetes_validate.ValidationError, match="periodSecond"):
        kubernetes_validate.validate(statefulset, "1.31.0", strict=True)


def _crd_models() -> str:
    models = os.environ.get("VIGIL_CRD_MODELS")
    if not models or not os.path.isdir(models):
        pytest.skip("CRD schemas not found: `bash ops/helm/get.sh crd-models` (needs npm)")
    if shutil.which("node") is None:
        pytest.skip("node not found (install Node.js 20+)")
    return models


def check_custom_resources(objects: list[dict]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["node", str(CHART.parent / "check-custom-resources.mjs"), _crd_models()],
        input=json.dumps(objects),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_custom_resources_are_valid_against_their_crds(rendered):
    objects = [o for name in VALUES for o in rendered[name, "1.31.0"] if custom(o)]
    assert {"ServiceMonitor", "PrometheusRule", "ScaledObject", "TriggerAuthentication"} == {
        o["kind"] for o in objects
    }
    result = check_custom_resources(objects)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok ") == len(objects)


def test_the_crd_check_catches_a_bad_field(rendered):
    monitor = copy.deepcopy(one(rendered["everything", "1.31.0"], "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "half a minute"
    scaled = copy.deepcopy(one(rendered["everything", "1.31.0"], "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 5000
    result = check_custom_resources([monitor, scaled])
    assert result.returncode == 1
    assert "invalid ServiceMonitor" in result.stdout and "interval" in result.stdout
    assert "invalid ScaledObject" in result.stdout and "lagThreshold" in result.stdout


# -- what each values set renders -------------------------------------------------------------


def test_defaults_render_the_daemon_and_nothing_optional(rendered):
    objects = rendered["defaults", "1.31.0"]
    assert kinds(objects) == ["ConfigMap", "Service", "ServiceAccount", "StatefulSet"]
    statefulset = one(objects, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 1
    assert "volumeClaimTemplates" not in statefulset["spec"]  # store = "kafka"


def test_everything_on(rendered):
    assert kinds(rendered["everything", "1.31.0"]) == [
        "ConfigMap",
        "ConfigMap",
        "PodDisruptionBudget",
        "PrometheusRule",
        "ScaledObject",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "StatefulSet",
    ]


def test_the_metrics_endpoint_listens_for_the_cluster(rendered):
    for name in VALUES:
        config = vigil_toml(rendered[name, "1.31.0"])
        assert config["metrics"] == {"host": "0.0.0.0", "port": 9464}


def test_service_selects_the_pods_and_the_monitor_the_service(rendered):
    objects = rendered["everything", "1.31.0"]
    pod_labels = one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert one(objects, "StatefulSet")["spec"]["serviceName"] == service["metadata"]["name"]
    monitor = one(objects, "ServiceMonitor")
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports
        assert service_ports[endpoint["port"]]["targetPort"] in container_ports
        job = {"action": "replace", "targetLabel": "job", "replacement": "vigil"}
        assert job in endpoint["relabelings"]
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_probes_name_the_metrics_port(rendered):
    for name in VALUES:
        objects = rendered[name, "1.31.0"]
        vigil = container(objects)
        ports = {p["name"]: p["containerPort"] for p in vigil["ports"]}
        assert ports["metrics"] == vigil_toml(objects)["metrics"]["port"]
        paths = {
            probe: vigil[probe]["httpGet"]["path"]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe")
            if vigil[probe]["httpGet"]["port"] == "metrics"
        }
        assert paths == {
            "startupProbe": "/healthz",
            "livenessProbe": "/healthz",
            "readinessProbe": "/readyz",
        }


def test_pods_run_unprivileged_on_a_read_only_root(rendered):
    objects = rendered["defaults", "1.31.0"]
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    vigil = container(objects)
    assert vigil["securityContext"]["readOnlyRootFilesystem"] is True
    assert vigil["securityContext"]["allowPrivilegeEscalation"] is False
    assert vigil["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in vigil["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    state_dir = Path(vigil_toml(objects)["state"]["dir"])
    assert any(state_dir.is_relative_to(path) for path in mounts if mounts[path] == "state")
    assert vigil["resources"]["limits"]["memory"]


def test_the_grace_period_outlasts_the_shutdown_deadline(helm, tmp_path, rendered):
    pod = one(rendered["defaults", "1.31.0"], "StatefulSet")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 30.0  # the default deadline_seconds
    values = {"config": {"shutdown": {"deadline_seconds": 100.5}}}
    statefulset = one(render_values(helm, values, tmp_path), "StatefulSet")
    assert statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 100.5
    values["terminationGracePeriodSeconds"] = 60
    assert "must exceed config.shutdown.deadline_seconds" in render_error(helm, values, tmp_path)


def test_file_store_gets_a_claim_per_pod_and_kafka_store_none(rendered):
    statefulset = one(rendered["file-store", "1.31.0"], "StatefulSet")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert "state" not in {v["name"] for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    kafka_store = one(rendered["defaults", "1.31.0"], "StatefulSet")["spec"]["template"]["spec"]
    assert "emptyDir" in {v["name"]: v for v in kafka_store["volumes"]}["state"]


def _secret_files(objects: list[dict]) -> dict[str, str]:
    """Mounted path of each Secret key the pod mounts."""
    vigil = container(objects)
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    (mount,) = [m for m in vigil["volumeMounts"] if m["name"] == volume["name"]]
    return {i["key"]: f"{mount['mountPath']}/{i['path']}" for i in volume["secret"]["items"]}


def test_the_kafka_secret_is_mounted_and_wired_to_the_config(rendered):
    sasl = rendered["sasl", "1.31.0"]
    files = _secret_files(sasl)
    kafka = vigil_toml(sasl)["kafka"]
    assert kafka["sasl_password_file"] == files["password"]
    assert kafka["ssl_cafile"] == files["ca.crt"]
    mtls = rendered["mtls", "1.31.0"]
    files, kafka = _secret_files(mtls), vigil_toml(mtls)["kafka"]
    assert (kafka["ssl_cafile"], kafka["ssl_certfile"], kafka["ssl_keyfile"]) == (
        files["ca.crt"],
        files["tls.crt"],
        files["tls.key"],
    )


def test_the_sasl_password_can_come_as_the_environment_variable(helm, tmp_path):
    values = copy.deepcopy(SASL)
    values["kafkaSecret"]["saslPasswordEnv"] = True
    objects = render_values(helm, values, tmp_path)
    env = {e["name"]: e for e in container(objects).get("env", [])}
    reference = env["VIGIL_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": "kafka-creds", "key": "password"}
    assert "sasl_password_file" not in vigil_toml(objects)["kafka"]
    assert "password" not in _secret_files(objects)


def test_the_scaled_object_scales_the_statefulset_on_the_group_lag(rendered):
    objects = rendered["everything", "1.31.0"]
    scaled, statefulset = one(objects, "ScaledObject"), one(objects, "StatefulSet")
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("StatefulSet", statefulset["metadata"]["name"])
    assert "replicas" not in statefulset["spec"]  # KEDA owns the count
    assert scaled["spec"]["maxReplicaCount"] == 6
    kafka = vigil_toml(objects)["kafka"]
    triggers = scaled["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"kafka"}
    assert {t["metadata"]["consumerGroup"] for t in triggers} == {kafka["group_id"]}
    assert {t["metadata"]["bootstrapServers"] for t in triggers} == {kafka["bootstrap_servers"]}
    assert {t["metadata"]["lagThreshold"] for t in triggers} == {"5000"}
    assert sorted(t["metadata"]["topic"] for t in triggers) == [
        "ml.decisions",
        "seldon.seldon-mesh.model.iris.inputs",
        "seldon.seldon-mesh.model.iris.outputs",
    ]
    assert not any("authenticationRef" in t for t in triggers)  # PLAINTEXT


def test_the_seldon_topics_keda_watches_are_the_daemons(rendered):
    """The chart names a Seldon rule's topics as the daemon does."""
    from vigil.daemon.config import parse_config
    from vigil.daemon.metrics import Metrics
    from vigil.daemon.service import build_rules

    objects = rendered["everything", "1.31.0"]
    config = parse_config(vigil_toml(objects))
    rules = build_rules(config, Metrics())
    try:
        read = {t for r in rules for t in r.topics}
    finally:
        for r in rules:
            r.close()
    watched = {t["metadata"]["topic"] for t in one(objects, "ScaledObject")["spec"]["triggers"]}
    assert watched <= read
    assert {"seldon.seldon-mesh.model.iris.inputs", "ml.decisions"} <= watched


def test_a_secured_cluster_gets_a_trigger_authentication(rendered):
    objects = rendered["sasl", "1.31.0"]
    scaled, auth = one(objects, "ScaledObject"), one(objects, "TriggerAuthentication")
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
        metadata = trigger["metadata"]
        assert (metadata["sasl"], metadata["tls"]) == ("scram_sha512", "enable")
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    username = one(objects, "Secret")
    assert refs["username"] == (username["metadata"]["name"], "username")
    assert username["stringData"]["username"] == vigil_toml(objects)["kafka"]["sasl_username"]
    assert refs["password"] == ("kafka-creds", "password")
    assert refs["ca"] == ("kafka-creds", "ca.crt")
    mtls = rendered["mtls", "1.31.0"]
    auth = one(mtls, "TriggerAuthentication")
    refs = {r["parameter"]: r["key"] for r in auth["spec"]["secretTargetRef"]}
    assert refs == {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"}
    assert all("sasl" not in t["metadata"] for t in one(mtls, "ScaledObject")["spec"]["triggers"])


def test_keda_and_an_hpa_are_never_rendered_together(helm, tmp_path, rendered):
    for objects in rendered.values():
        assert not {"ScaledObject", "HorizontalPodAutoscaler"} <= set(kinds(objects))
    hpa = render_values(helm, {"autoscaling": {"enabled": True}}, tmp_path)
    assert "HorizontalPodAutoscaler" in kinds(hpa) and "ScaledObject" not in kinds(hpa)
    assert one(hpa, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    both = {"autoscaling": {"enabled": True}, "keda": {"enabled": True}}
    assert "enable one of them" in render_error(helm, both, tmp_path)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"serviceMonitor": {"enable": True}}, "enable"),
        ({"metrics": {"port": 70000}}, "port"),
        ({"config": {"metrics": {"host": "127.0.0.1"}}}, "config.metrics.host: the chart sets it"),
        ({"config": {"metrics": {"enabled": False}}}, "config.metrics.enabled"),
        ({"config": {"rules": []}}, "rules"),
        (
            {"replicaCount": 2, "config": {"kafka": {"transactional_id": "vigil-0"}}},
            "would fence each other",
        ),
        ({"kafkaSecret": {"caKey": "ca.crt"}}, "kafkaSecret.name"),
        (
            {
                "kafkaSecret": {"name": "s", "saslPasswordKey": "p"},
                "config": {"kafka": {"sasl_password_file": "/x"}},
            },
            "config.kafka.sasl_password_file: set by the chart",
        ),
        (
            {"keda": {"enabled": True}, "config": {"kafka": SASL["config"]["kafka"]}},
            "KEDA reads the password from kafkaSecret",
        ),
    ],
)
def test_bad_values_are_refused_with_the_reason(helm, tmp_path, values, message):
    assert message in render_error(helm, values, tmp_path)


def test_the_install_notes_say_what_runs_and_how_to_reach_it(helm, tmp_path):
    """NOTES.txt, which `helm template` leaves out, rendered through a copy of the chart
    that includes it in a ConfigMap."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes.tpl").write_text(
        f'{{{{- define "notes" -}}}}{notes}{{{{- end }}}}'
    )
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: |\n"
        '{{ include "notes" . | indent 4 }}\n'
    )
    values = _values_file(EVERYTHING, tmp_path)
    result = _run_helm(
        helm, "template", RELEASE, str(chart), "-n", NAMESPACE, "--kube-version", "1.31.0",
        "-f", str(values), "--show-only", "templates/notes.yaml",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = yaml.safe_load(result.stdout)["data"]["notes"]
    assert f"StatefulSet {FULLNAME} in namespace {NAMESPACE}" in text
    assert "seldon.seldon-mesh.model.iris.inputs" in text and "ml.decisions" in text
    assert "consumer group vigil-audit" in text
    assert f"port-forward {FULLNAME}-0 9464:metrics" in text
    assert "between 1 and 6 replicas" in text


# -- one source of truth: the alert rules and the dashboard -------------------------------------


def test_the_chart_files_are_the_ops_files():
    for chart_file, source in (
        (CHART / "files" / "alerts.yml", ALERTS),
        (CHART / "files" / "vigil-dashboard.json", DASHBOARD),
    ):
        assert chart_file.read_bytes() == source.read_bytes(), (
            f"{chart_file} differs from {source}: `make chart-files` copies it"
        )


def test_the_prometheus_rule_is_alerts_yml(rendered):
    rule = one(rendered["everything", "1.31.0"], "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


def test_the_dashboard_config_map_is_the_dashboard(helm, tmp_path, rendered):
    objects = rendered["everything", "1.31.0"]
    dashboard = one(objects, "ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Vigil"}
    shipped = json.loads(dashboard["data"]["vigil-dashboard.json"])
    assert shipped == json.loads(DASHBOARD.read_text())
    values = {"grafanaDashboard": {"enabled": True, "label": "dashboards", "labelValue": "vigil"}}
    relabelled = one(render_values(helm, values, tmp_path), "ConfigMap", f"{FULLNAME}-dashboard")
    assert relabelled["metadata"]["labels"]["dashboards"] == "vigil"


needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not found (apt-get install prometheus, or a Prometheus release)",
)


@needs_promtool
def test_the_rendered_rules_pass_promtool(rendered, tmp_path):
    rule = one(rendered["everything", "1.31.0"], "PrometheusRule")
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rule["spec"]))
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yml")
    for command in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        result = subprocess.run(
            ["promtool", *command], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr


# -- the rendered config against the real daemon --------------------------------------------------


def _vigil_cli() -> Path:
    cli = Path(sys.executable).with_name("vigil")
    if not cli.exists():
        pytest.skip(f"no vigil console script next to {sys.executable}: pip install -e .")
    return cli


def _mapped(text: str, mapping: dict[str, Path]) -> str:
    """The config with the pod's paths replaced by local ones."""
    for pod_path, local in sorted(mapping.items(), key=lambda item: -len(item[0])):
        text = text.replace(f'"{pod_path}', f'"{local}')
    return text


def _dev_secret(directory: Path, security: dict[str, str]) -> Path:
    """A local copy of the Secret the values sets name, holding the dev broker's
    credentials (check-config loads the certificates)."""
    directory.mkdir()
    for key, source in (
        ("password", "sasl_password_file"),
        ("ca.crt", "ssl_cafile"),
        ("tls.crt", "ssl_certfile"),
        ("tls.key", "ssl_keyfile"),
    ):
        shutil.copy(security[source], directory / key)
    return directory


@pytest.mark.parametrize("name", VALUES)
def test_the_rendered_config_passes_check_config(rendered, tmp_path, request, name):
    objects = rendered[name, "1.31.0"]
    secret_dir = tmp_path / "secret"
    if "kafkaSecret" in VALUES[name]:
        _dev_secret(secret_dir, request.getfixturevalue("kafka_security"))
    text = one(objects, "ConfigMap", FULLNAME)["data"]["vigil.toml"]
    config = tmp_path / "vigil.toml"
    config.write_text(_mapped(text, {"/etc/vigil/kafka": secret_dir, "/var/lib/vigil": tmp_path}))
    command = [str(_vigil_cli()), "check-config", str(config)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{config}: ok" in result.stdout


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


def _family(name: str) -> str:
    return re.sub(r"_(bucket|sum|count|total)$", "", name)


def dashboard_metrics() -> set[str]:
    """The metric families the dashboard's queries select."""
    return {_family(n) for n in re.findall(r"\bvigil_[a-z0-9_]+", DASHBOARD.read_text())}


CHECKED = re.compile(r'^vigil_events_total\{[^}]*outcome="checked"[^}]*\} (\S+)', re.M)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for value in values:
                await producer.send(topic, value)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(send())


@pytest.mark.parametrize("name", ["defaults", "sasl"])
def test_the_pods_command_line_runs_the_daemon_against_the_broker(
    helm, tmp_path, kafka_bootstrap, kafka_security, name
):
    """The container's arguments with the rendered vigil.toml (the pod's paths mapped to
    local ones) against the dev broker: ready and live at the port the probes name, and
    /metrics holds every family the dashboard queries."""
    topic = f"helm-{uuid.uuid4().hex[:8]}"
    port = free_port()
    values = copy.deepcopy(VALUES[name])
    values.setdefault("config", {}).setdefault("kafka", {})
    values["metrics"] = {"port": port}
    values["config"]["kafka"]["group_id"] = f"vigil-{topic}"
    values["config"]["kafka"]["bootstrap_servers"] = kafka_bootstrap
    values["config"]["rules"] = [{"name": "robust", "kind": "ior", "topic": topic, "eps": 0.1}]
    secret_dir = _dev_secret(tmp_path / "secret", kafka_security)
    if name == "sasl":
        values["config"]["kafka"]["bootstrap_servers"] = kafka_security["sasl_ssl"]
        values["config"]["kafka"]["sasl_username"] = kafka_security["sasl_username"]
    objects = render_values(helm, values, tmp_path)
    vigil = container(objects)
    probe_port = {p["name"]: p["containerPort"] for p in vigil["ports"]}[
        vigil["readinessProbe"]["httpGet"]["port"]
    ]
    assert probe_port == port
    (config_dir := tmp_path / "etc").mkdir()
    mapping = {"/etc/vigil/kafka": secret_dir, "/var/lib/vigil": tmp_path, "/etc/vigil": config_dir}
    text = one(objects, "ConfigMap", FULLNAME)["data"]["vigil.toml"]
    (config_dir / "vigil.toml").write_text(_mapped(text, mapping))
    args = [_mapped(f'"{a}', mapping)[1:] for a in vigil["args"]]
    assert args[:2] == ["run", "--config"]
    _produce(
        kafka_bootstrap,
        topic,
        [
            json.dumps({"id": i, "model": "m", "x": [0.0, i / 100], "y": i % 2}).encode()
            for i in range(20)
        ],
    )
    log = tmp_path / "daemon.log"
    with log.open("w") as stderr:
        daemon = subprocess.Popen(
            [str(_vigil_cli()), *args],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{probe_port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert daemon.poll() is None, log.read_text()[-3000:]
            status, _ = _get(base + vigil["readinessProbe"]["httpGet"]["path"])
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200, log.read_text()[-3000:]
        assert _get(base + vigil["livenessProbe"]["httpGet"]["path"])[0] == 200
        assert _get(base + vigil["startupProbe"]["httpGet"]["path"])[0] == 200
        checked = None
        while time.monotonic() < deadline:
            _, text = _get(base + "/metrics")
            checked = CHECKED.search(text)
            if checked and float(checked.group(1)) >= 20:
                break
            time.sleep(0.5)
        assert checked and float(checked.group(1)) >= 20, text[-3000:]
        families = {_family(f) for f in re.findall(r"^# TYPE (\S+)", text, re.M)}
        missing = dashboard_metrics() - families
        assert not missing, f"the dashboard queries series /metrics lacks: {sorted(missing)}"
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
    assert daemon.returncode == 0, log.read_text()[-3000:]
