"""Shared fixtures (the dev broker, the optional ../shared/data sets) and the mark that splits
the suite into its two runs (tests/run_suite.sh)."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CERTIFAIR_ZIP = SHARED_DATA / "fairness-streams-certifair.zip"

BROKER_FIXTURES = {"kafka_bootstrap", "kafka_security"}


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """Mark every test that uses the dev broker ``broker``, before ``-m`` selects by it.

    `make test` runs the broker tests and the others side by side, as two pytest runs:
    the broker tests time daemons against deadlines and share the dev broker, so they
    keep their serial order, while the CPU-bound tests fill the other core.
    """
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)
    return (yield)


@pytest.fixture(scope="session")
def certifair_dir(tmp_path_factory) -> Path:
    """The Certifair decision streams, unpacked once per session."""
    if not CERTIFAIR_ZIP.exists():
        pytest.skip(f"shared data absent: {CERTIFAIR_ZIP}")
    out = tmp_path_factory.mktemp("certifair")
    with zipfile.ZipFile(CERTIFAIR_ZIP) as z:
        z.extractall(out)
    return out / "predictions"


def load_stream(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(features, predictions) of a Certifair stream CSV (label column dropped)."""
    data = np.loadtxt(path, delimiter=",", skiprows=1)
    return np.ascontiguousarray(data[:, 2:]), data[:, 0].astype(np.int64)


@pytest.fixture
def compas() -> tuple[np.ndarray, np.ndarray]:
    """The first 3000 decisions of the bundled COMPAS demo stream."""
    from vigil.daemon.demo import bundled_stream

    x, y = load_stream(bundled_stream())
    return x[:3000], y[:3000]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """Address of the dev broker that `make test` starts (ops/kafka/dev-kafka.sh)."""
    address = os.environ.get("VIGIL_KAFKA_BOOTSTRAP")
    if not address:
        pytest.skip("VIGIL_KAFKA_BOOTSTRAP unset: run `make test` to start the dev broker")
    return address


@pytest.fixture(scope="session")
def kafka_security() -> dict[str, str]:
    """The dev broker's secured listeners and client credentials (its security.json)."""
    path = os.environ.get("VIGIL_KAFKA_SECURITY")
    if not path:
        pytest.skip("VIGIL_KAFKA_SECURITY unset: run `make test` to start the dev broker")
    if not os.path.exists(path):
        pytest.skip(f"{path} absent: the dev broker running predates its secured listeners")
    with open(path) as f:
        return json.load(f)


ACASXU = SHARED_DATA / "acasxu"


@pytest.fixture(scope="session")
def acasxu() -> Path:
    """The VNN-COMP ACAS Xu benchmark folder (45 networks, 10 properties)."""
    if not (ACASXU / "acasxu_instances.csv").exists():
        pytest.skip(f"shared data absent: {ACASXU}")
    return ACASXU
