"""The reach rule's own state, driven directly with its worker lane (no broker): what happens
when the model's input width changes, live or across a restart."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from tests import offload_jobs
from vigil.connectors.events import Record, decode_decision
from vigil.daemon.adapters import ReachRule, RuleContext, StaleSnapshot
from vigil.daemon.config import parse_config
from vigil.daemon.metrics import Metrics
from vigil.daemon.offload import OffloadPool, process_executor
from vigil.rules.reach import worker
from vigil.rules.reach.network import Network

DECISIONS, MODELS = ("decisions", 0), ("models", 0)


def network(inputs: int, seed: int) -> Network:
    rng = np.random.default_rng(seed)
    return Network.from_arrays(
        [(rng.normal(size=(6, inputs)), rng.normal(size=6)), (rng.normal(size=(1, 6)), [0.0])]
    )


@pytest.fixture
def make_rule(tmp_path):
    """Reach rules starting from a 3-input model, each with a real one-process lane."""
    (tmp_path / "m.onnx").write_bytes(network(3, 0).to_onnx())
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": "unused:9092"},
            "rules": [
                {
                    "name": "r",
                    "kind": "reach",
                    "topic": DECISIONS[0],
                    "model": "m",
                    "models_topic": MODELS[0],
                    "onnx": str(tmp_path / "m.onnx"),
                    "C": [[1.0]],
                    "d": [1e6],
                    "window": 50,
                }
            ],
        }
    ).rules[0]
    pools = []

    def make_pool(name: str, workers: int, timeout: float) -> OffloadPool:
        pools.append(
            OffloadPool(lambda: process_executor(workers), workers, Metrics(), 8, timeout, name)
        )
        return pools[-1]

    yield lambda: ReachRule(config, RuleContext(Metrics(), None, make_pool))
    for p in pools:
        p.shutdown()


def decisions(x: np.ndarray, first: int, tp: tuple[str, int] = DECISIONS) -> list:
    return [
        decode_decision(
            Record(*tp, first + i, orjson.dumps({"id": i, "model": "m", "x": row, "y": 0}))
        )
        for i, row in enumerate(x.tolist())
    ]


def update(version: str, net: Network, offset: int) -> Record:
    event = {"model": "m", "version": version, "onnx": base64.b64encode(net.to_onnx()).decode()}
    return Record(*MODELS, offset, orjson.dumps(event))


async def test_a_model_of_another_width_replaces_the_window(make_rule):
    """The model fixes the input space: after a 4-input model arrives, the 3-value inputs
    are gone from the window and 3-value decisions are dead letters."""
    rule = make_rule()
    rng = np.random.default_rng(1)
    first = await rule.check(DECISIONS, decisions(rng.uniform(size=(5, 3)), 0), 0)
    assert [orjson.loads(e.message.value)["status"] for e in first.events] == ["holds"]

    result = await rule.handle(MODELS, [update("2", network(4, 1), 0)], 0)
    assert result.checked == 1 and not result.dead and not result.events  # nothing to verify
    assert rule.version == "2" and not rule.windows

    old = await rule.check(DECISIONS, decisions(rng.uniform(size=(2, 3)), 5), 0)
    assert [reason for _, reason, _ in old.dead] == ["dimension", "dimension"]
    new = await rule.check(DECISIONS, decisions(rng.uniform(size=(3, 4)), 7), 0)
    event = orjson.loads(new.events[0].message.value)
    assert (event["version"], event["decisions"], event["status"]) == ("2", 3, "holds")
    assert len(event["input_set"]["lower"]) == 4


async def test_a_snapshot_of_another_width_is_not_restored(make_rule):
    """A window snapshot taken under a 4-input model is refused (the partition is replayed);
    a restored model of another width empties a restored window."""
    rule = make_rule()
    await rule.handle(MODELS, [update("2", network(4, 1), 0)], 0)
    await rule.check(DECISIONS, decisions(np.ones((4, 4)), 0), 0)
    window, model = rule.snapshot(DECISIONS).blob, rule.snapshot(MODELS).blob

    restarted = make_rule()  # its configured model takes 3 inputs
    with pytest.raises(StaleSnapshot, match="inputs have 4 values, the model takes 3"):
        restarted.restore(DECISIONS, [window])
    assert not restarted.windows

    older = make_rule()
    await older.check(DECISIONS, decisions(np.ones((2, 3)), 0), 0)
    older.restore(MODELS, [model])
    assert older.version == "2" and not older.windows
    older.restore(DECISIONS, [window])
    assert older.windows[DECISIONS].shape == (4, 4)


async def test_a_model_check_whose_worker_died_is_tried_again(make_rule, tmp_path, monkeypatch):
    """A worker that dies while checking an update (an out-of-memory kill, say) does not
    make a good model a dead letter."""
    monkeypatch.setenv("VIGIL_TEST_MARKER", str(tmp_path / "crashed"))
    monkeypatch.setattr(worker, "check_model", offload_jobs.check_model_after_a_crash)
    rule = make_rule()
    result = await rule.handle(MODELS, [update("2", network(3, 1), 0)], 0)
    assert (tmp_path / "crashed").exists()
    assert result.checked == 1 and not result.dead and rule.version == "2"


async def test_each_partition_keeps_its_own_window(make_rule):
    """The input set covers every assigned partition's window; a snapshot holds, and a
    restore or revocation touches, one partition's window only."""
    other = (DECISIONS[0], 1)
    rule = make_rule()
    await rule.check(DECISIONS, decisions(np.zeros((3, 3)), 0), 0)
    both = await rule.check(other, decisions(np.full((2, 3), 5.0), 0, other), 0)
    event = orjson.loads(both.events[0].message.value)
    assert event["decisions"] == 5
    assert event["input_set"]["lower"] == [0.0] * 3 and event["input_set"]["upper"] == [5.0] * 3
    assert (rule.history_size(DECISIONS), rule.history_size(other)) == (3, 2)

    snapshot = rule.snapshot(DECISIONS).blob
    await rule.check(other, decisions(np.full((1, 3), 7.0), 2, other), 0)
    rule.restore(DECISIONS, [snapshot])  # a rebalance hands partition 0 back
    assert rule.windows[other].max() == 7.0 and rule.windows[DECISIONS].max() == 0.0

    rule.drop(other)
    alone = await rule.check(DECISIONS, decisions(np.ones((1, 3)), 3), 0)
    event = orjson.loads(alone.events[0].message.value)
    assert event["decisions"] == 4 and event["input_set"]["upper"] == [1.0] * 3
