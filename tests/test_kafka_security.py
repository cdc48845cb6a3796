"""Secured Kafka: the daemon over SASL_SSL (SCRAM-SHA-512) and mutual TLS against the dev
broker's secured listeners, one-line errors for each way a connection's security can be
wrong, and secrets that never reach logs, errors, check-config output or metrics."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tomllib
import types
import uuid
from pathlib import Path

import orjson
import pytest

from tests.daemon_harness import (
    Daemon,
    consume_all,
    create_topic,
    decision_events,
    expected_alerts,
    free_port,
    produce,
    wait_http,
    witness_map,
)
from vigil.connectors.kafka_security import (
    BrokerRejected,
    BrokerUnavailable,
    KafkaSecurity,
    _explain,
    diagnose,
)
from vigil.daemon.cli import main
from vigil.daemon.config import ConfigError, KafkaConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
RULE = """
[[rules]]
name = "fair"
kind = "ior"
topic = "decisions"
eps = 0.1
"""


def _password(security: dict) -> str:
    return Path(security["sasl_password_file"]).read_text().strip()


def _scram(security: dict, mechanism: str = "SCRAM-SHA-512") -> str:
    return f"""
security_protocol = "SASL_SSL"
ssl_cafile = "{security["ssl_cafile"]}"
sasl_mechanism = "{mechanism}"
sasl_username = "{security["sasl_username"]}"
sasl_password_file = "{security["sasl_password_file"]}"
"""


def _mutual_tls(security: dict) -> str:
    return f"""
security_protocol = "SSL"
ssl_cafile = "{security["ssl_cafile"]}"
ssl_certfile = "{security["ssl_certfile"]}"
ssl_keyfile = "{security["ssl_keyfile"]}"
"""


def _config(tmp_path: Path, bootstrap: str, kafka: str, name: str = "vigil.toml") -> Path:
    path = tmp_path / name
    path.write_text(f'[kafka]\nbootstrap_servers = "{bootstrap}"\n{kafka}\n{RULE}')
    return path


def _run(config: Path, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vigil.daemon.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=config.parent,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize("setup", ["sasl_ssl-scram-sha-512", "sasl_ssl-oauthbearer", "mutual-tls"])
async def test_daemon_over_a_secured_listener_exactly_once(
    kafka_bootstrap, kafka_security, tmp_path, compas, setup
):
    """OAUTHBEARER: with a provider bound to its event loop, each client has its own (the
    producer runs in another loop)."""
    x, y = compas
    x, y = x[:1500], y[:1500]
    if setup == "mutual-tls":
        listener, settings = kafka_security["ssl"], _mutual_tls(kafka_security)
    elif setup == "sasl_ssl-oauthbearer":  # the provider's module beside the config
        shutil.copy(Path(__file__).with_name("kafka_tokens.py"), tmp_path)
        listener = kafka_security["sasl_ssl"]
        settings = (
            f'security_protocol = "SASL_SSL"\nssl_cafile = "{kafka_security["ssl_cafile"]}"\n'
            'sasl_mechanism = "OAUTHBEARER"\n'
            'sasl_oauth_token_provider = "kafka_tokens:LoopBoundToken"\n'
        )
    else:
        listener, settings = kafka_security["sasl_ssl"], _scram(kafka_security)
    daemon = Daemon(
        kafka_bootstrap,
        tmp_path,
        exactly_once=True,
        listener=listener,
        kafka_settings=settings,
        log_level="debug",
    )
    expected = expected_alerts(x, y, daemon.eps)
    await produce(kafka_bootstrap, daemon.topic, decision_events(x, y, "compas"))
    daemon.start()
    try:
        alerts = await consume_all(kafka_bootstrap, daemon.alerts_topic, len(expected), 120)
        assert len(alerts) == len(expected), daemon.log_text()[-3000:]
        assert witness_map(alerts) == expected
        metrics = await wait_http(daemon.port, "/metrics")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, daemon.log_text()
    finally:
        daemon.kill()
    log = daemon.log_text()
    secret = _password(kafka_security)
    assert secret not in log and secret not in metrics

    # the auditor's report reads the alert topic with the same configuration
    report = subprocess.run(
        [
            sys.executable, "-m", "vigil.daemon.cli", "report",
            f"kafka://{listener}/{daemon.alerts_topic}",
            "--config", str(tmp_path / "vigil.toml"), "--out", str(tmp_path / "report.html"),
        ],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert orjson.loads(report.stdout)["alerts"] == len(expected)
    assert secret not in report.stdout + report.stderr


def test_check_config_connect_reports_topics_per_mechanism(
    kafka_bootstrap, kafka_security, tmp_path, capsys
):
    cases = {
        "SCRAM-SHA-256": (kafka_security["sasl_ssl"], _scram(kafka_security, "SCRAM-SHA-256")),
        "PLAIN": (kafka_security["sasl_ssl"], _scram(kafka_security, "PLAIN")),
        "OAUTHBEARER": (
            kafka_security["sasl_ssl"],
            f'security_protocol = "SASL_SSL"\nssl_cafile = "{kafka_security["ssl_cafile"]}"\n'
            'sasl_mechanism = "OAUTHBEARER"\n'
            'sasl_oauth_token_provider = "tests.kafka_tokens:UnsignedToken"\n',
        ),
        "mutual TLS": (kafka_security["ssl"], _mutual_tls(kafka_security)),
    }
    topic = f"decisions-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka_bootstrap, topic, partitions=3))
    for name, (listener, settings) in cases.items():
        config = _config(tmp_path, listener, settings)
        config.write_text(config.read_text().replace('topic = "decisions"', f'topic = "{topic}"'))
        assert main(["check-config", "--connect", str(config)]) == 0, name
        out = capsys.readouterr().out
        assert f"connected to {listener}" in out, name
        assert f"reads {topic}: 3 partitions" in out, out
        assert "writes vigil.alerts:" in out, name
        assert _password(kafka_security) not in out


def _error_line(result: subprocess.CompletedProcess) -> str:
    """The command's own error line: the last on stderr."""
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_a_wrong_password_is_one_line_and_exit_2(kafka_security, tmp_path):
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    settings = _scram(kafka_security).replace(kafka_security["sasl_password_file"], str(wrong))
    result = _run(_config(tmp_path, kafka_security["sasl_ssl"], settings))
    assert result.returncode == 2
    line = _error_line(result)
    assert line.startswith("vigil run: error: Kafka broker")
    assert "authentication failed" in line and "sasl_username" in line
    output = result.stdout + result.stderr
    assert "not-the-password" not in output and _password(kafka_security) not in output


def test_an_untrusted_certificate_names_ssl_cafile(kafka_security, tmp_path):
    settings = "\n".join(
        line for line in _scram(kafka_security).splitlines() if "ssl_cafile" not in line
    )
    result = _run(_config(tmp_path, kafka_security["sasl_ssl"], settings))
    assert result.returncode == 2
    line = _error_line(result)
    assert "certificate is not trusted" in line and "set ssl_cafile" in line


def test_mutual_tls_without_a_client_certificate_names_it(kafka_security, tmp_path):
    settings = f'security_protocol = "SSL"\nssl_cafile = "{kafka_security["ssl_cafile"]}"\n'
    result = _run(_config(tmp_path, kafka_security["ssl"], settings))
    assert result.returncode == 2
    assert "refused the client certificate" in _error_line(result)


def test_plaintext_spoken_to_a_tls_port_and_the_reverse(kafka_bootstrap, kafka_security, tmp_path):
    result = _run(_config(tmp_path, kafka_security["ssl"], ""))
    assert result.returncode == 2
    line = _error_line(result)
    assert "closed the connection at once" in line and "security_protocol" in line

    settings = f'security_protocol = "SSL"\nssl_cafile = "{kafka_security["ssl_cafile"]}"\n'
    result = _run(_config(tmp_path, kafka_bootstrap, settings, "tls.toml"))
    assert result.returncode == 2
    line = _error_line(result)
    assert "TLS handshake failed" in line and "plaintext listener" in line


async def test_nothing_listening_is_unavailable_not_rejected():
    port = free_port()
    error = await diagnose(f"127.0.0.1:{port}", KafkaSecurity())
    assert isinstance(error, BrokerUnavailable)
    assert f"127.0.0.1:{port}" in str(error)


def test_secrets_stay_out_of_check_config_output_errors_and_reprs(tmp_path, capsys):
    secret = "s3cret-Inline-Password"
    kafka = (
        'security_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\n'
        f'sasl_username = "vigil"\nsasl_password = "{secret}"\n'
    )
    config = _config(tmp_path, "127.0.0.1:1", kafka)
    assert main(["check-config", str(config)]) == 0
    loaded = load_config(config)
    assert loaded.kafka.security().password == secret
    shown = capsys.readouterr()
    texts = [shown.out, shown.err, repr(loaded), str(loaded), repr(loaded.kafka.security())]
    bad = config.read_text().replace("eps = 0.1", "eps = -1")
    config.write_text(bad)
    assert main(["check-config", str(config)]) == 2
    shown = capsys.readouterr()
    texts += [shown.out, shown.err]
    assert "rules.0.eps" in shown.err
    both = tmp_path / "both.toml"
    both.write_text(
        bad.replace("eps = -1", "eps = 0.1").replace(
            'sasl_username = "vigil"', 'sasl_username = "vigil"\nsasl_password_file = "pw"'
        )
    )
    with pytest.raises(ConfigError) as e:
        load_config(both)
    texts.append(str(e.value))
    assert "sasl_password and sasl_password_file: set one" in str(e.value)
    assert not [t for t in texts if secret in t]


@pytest.mark.parametrize(
    ("kafka", "message"),
    [
        (
            'ssl_cafile = "ca.pem"',
            "kafka: Value error, ssl_cafile is only used with security_protocol SSL",
        ),
        (
            'security_protocol = "SASL_SSL"',
            "needs sasl_mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)",
        ),
        (
            'security_protocol = "SASL_SSL"\nsasl_mechanism = "PLAIN"',
            "sasl_mechanism PLAIN needs sasl_username",
        ),
        (
            'security_protocol = "SASL_SSL"\nsasl_mechanism = "PLAIN"\nsasl_username = "u"',
            "sasl_password_file is needed (or sasl_password, or the VIGIL_KAFKA_SASL_PASSWORD",
        ),
        (
            'security_protocol = "SASL_SSL"\nsasl_mechanism = "OAUTHBEARER"',
            "OAUTHBEARER needs sasl_oauth_token_provider",
        ),
        (
            'security_protocol = "SASL_SSL"\nsasl_mechanism = "OAUTHBEARER"\n'
            'sasl_oauth_token_provider = "no_such_module:Provider"',
            "sasl_oauth_token_provider: cannot import no_such_module:Provider",
        ),
        (
            'security_protocol = "SSL"\nssl_certfile = "client.pem"',
            "ssl_certfile and ssl_keyfile go together",
        ),
        ('security_protocol = "SSL"\nssl_cafile = "missing.pem"', "kafka.ssl_cafile: no such file"),
        (
            'security_protocol = "SASL_SSL"\nsasl_mechanism = "PLAIN"\nsasl_username = "u"\n'
            'sasl_password_file = "empty"',
            "kafka.sasl_password_file: ",
        ),
        (
            'security_protocol = "SSL"\nssl_certfile = "empty"\nssl_keyfile = "empty"',
            "kafka.ssl_certfile, ssl_keyfile: cannot load the client certificate",
        ),
        ('security_protocol = "SSL"\nssl_cafile = "empty"', "kafka.ssl_cafile: cannot load CA"),
        ('security_protocol = "TLS"', "kafka.security_protocol: Input should be 'PLAINTEXT'"),
    ],
)
def test_security_settings_are_validated_naming_the_key(tmp_path, monkeypatch, kafka, message):
    monkeypatch.delenv("VIGIL_KAFKA_SASL_PASSWORD", raising=False)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path, "127.0.0.1:9092", kafka))
    assert message in str(e.value)


def test_secrets_come_from_a_file_beside_the_config_or_the_environment(tmp_path, monkeypatch):
    kafka = 'security_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-256"\nsasl_username = "u"'
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "pw").write_text("from-file\n")
    from_file = _config(tmp_path / "conf", "b:9093", kafka + '\nsasl_password_file = "pw"')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VIGIL_KAFKA_SASL_PASSWORD", "from-env")
    assert load_config(from_file).kafka.security().password == "from-file"
    from_env = _config(tmp_path, "b:9093", kafka)
    assert load_config(from_env).kafka.security().password == "from-env"
    options = load_config(from_env).kafka.security().client_options()
    assert options["sasl_plain_password"] == "from-env"
    assert options["ssl_context"].check_hostname is True


def test_the_documented_examples_are_valid_settings(monkeypatch):
    """Each managed-service example in docs/operations.md is a [kafka] section that passes
    validation (the MSK IAM one with its token module as written there)."""
    doc = (ROOT / "docs/operations.md").read_text()
    section = doc.split("## Secured clusters", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(toml|python)\n(.*?)```", section, re.S)
    module = types.ModuleType("msk_token")
    monkeypatch.setitem(sys.modules, "msk_token", module)
    module.MskIamToken = object
    tomls = [tomllib.loads(text)["kafka"] for lang, text in blocks if lang == "toml"]
    assert len(tomls) == 5
    for kafka in tomls:
        assert KafkaConfig.model_validate(kafka).security_protocol != "PLAINTEXT"
    python = [text for lang, text in blocks if lang == "python"]
    assert len(python) == 1 and "class MskIamToken(AbstractTokenProvider)" in python[0]


def test_a_certificate_for_another_host_name_is_named_as_such():
    """The hostname branch, on the error Python's ssl module raises for it (the dev broker's
    certificate names every address it listens on, so a live mismatch cannot be made)."""
    error = ssl.SSLCertVerificationError(1, "certificate verify failed: Hostname mismatch")
    error.verify_code, error.verify_message = 62, "Hostname mismatch"
    explained = _explain(error, "kafka.example:9093", KafkaSecurity(protocol="SSL"))
    assert isinstance(explained, BrokerRejected)
    assert "not for this host name" in str(explained)
    assert KafkaSecurity(protocol="SSL", check_hostname=False).ssl_context().check_hostname is False
