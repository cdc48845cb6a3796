"""The configuration of rules on a serving stack's traffic: what is refused, by key."""

from __future__ import annotations

import pytest

from vigil.daemon.adapters.serving import serving_topics
from vigil.daemon.config import ConfigError, parse_config
from vigil.daemon.service import internal_topics

KAFKA = {"bootstrap_servers": "127.0.0.1:9092", "group_id": "g"}


def config(rule: dict, **sections: dict) -> dict:
    base = {"name": "r", "kind": "ior", "eps": 0.1, "model": "iris"}
    return {"kafka": KAFKA, **sections, "rules": [{**base, **rule}]}


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ({"format": "seldon", "topic": "t"}, "leave out topic"),
        ({"format": "kserve"}, "needs topic"),
        ({"format": "seldon", "model": None}, "needs model"),
        ({"format": "seldon", "input": "embedding"}, "reads Vigil decision events only"),
        ({"topic": "t", "input_tensor": "x"}, "input_tensor applies to format seldon or kserve"),
        ({"format": "kserve", "topic": "t", "seldon_kind": "pipeline"}, "apply to format"),
        ({"format": "seldon", "features": ["a"], "input_tensor": "x"}, "exclude each other"),
        ({"format": "seldon", "name": "my rule"}, "only letters, digits"),
        (
            {"format": "seldon", "features": ["a", "c"], "categories": {"c": ["x", "y"]}, "dim": 2},
            "dim is 2, features make 3 columns",
        ),
    ],
)
def test_bad_serving_rules_are_refused_naming_the_key(rule, error):
    data = config({k: v for k, v in rule.items() if v is not None})
    if rule.get("model", "") is None:
        del data["rules"][0]["model"]
    with pytest.raises(ConfigError, match=error):
        parse_config(data)


def test_serving_rules_need_kafka_and_a_group_id_fit_for_topic_names():
    files = {"decisions": "d.jsonl"}
    outputs = {"alerts_file": "a.jsonl", "dead_letter_file": "d.jsonl"}
    data = {"files": files, "outputs": outputs, "rules": [config({"format": "seldon"})["rules"][0]]}
    with pytest.raises(ConfigError, match="formats seldon and kserve need"):
        parse_config(data)
    data = config({"format": "seldon"})
    data["kafka"] = {**KAFKA, "group_id": "my group"}
    with pytest.raises(ConfigError, match="group_id 'my group'"):
        parse_config(data)


def test_the_topics_a_seldon_rule_reads_and_makes():
    parsed = parse_config(
        config(
            {"format": "seldon", "seldon_kind": "pipeline", "seldon_namespace": "prod"},
            seldon={"prefix": "sc"},
        )
    )
    stages = serving_topics(parsed.rules[0], parsed.seldon, "g")
    assert stages.sources == {"sc.prod.pipeline.iris.inputs", "sc.prod.pipeline.iris.outputs"}
    assert internal_topics(parsed) == {"g.r.join": []}  # one partition
    features = parse_config(
        config(
            {
                "format": "kserve",
                "topic": "t",
                "features": ["a", "c"],
                "categories": {"c": ["x", "y"]},
            }
        )
    )
    assert features.rules[0].input_dim == 3


def test_the_documented_serving_configs_are_valid():
    import re
    import tomllib
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs/operations.md").read_text()
    section = text.split("## Connect your serving stack", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```toml\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    for block in blocks:
        data = tomllib.loads(block)
        parsed = parse_config({"kafka": KAFKA, **data})
        assert parsed.rules[0].format in ("seldon", "kserve")


async def test_the_decode_worker_is_started_only_for_rules_that_read_decision_events(tmp_path):
    """A serving stack's rules read requests and responses, never decision events: no
    worker process is started for them."""
    from vigil.daemon.metrics import Metrics
    from vigil.daemon.service import build_pipeline

    state = {"state": {"dir": str(tmp_path)}}
    for rule, reads in (({"format": "seldon"}, False), ({"topic": "decisions"}, True)):
        pipeline = build_pipeline(parse_config(config(rule, **state)), Metrics())
        assert (pipeline.reader is not None) == reads
