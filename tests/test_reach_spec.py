"""A VNN-LIB property as the output spec of the online `reach` rule and `vigil verify
reach`: the safe outputs of a disjunction of single unsafe constraints, as C y <= d."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from vigil.daemon.cli import main
from vigil.daemon.config import ConfigError, load_config
from vigil.rules.reach.network import Network
from vigil.rules.reach.query import safe_set
from vigil.rules.reach.sets import SpecError
from vigil.rules.reach.vnnlib import parse_query

OUTPUTS = "(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n"
OUTPUTS += "(declare-const Y_1 Real)\n"
UNSAFE = OUTPUTS + "(assert (or (>= Y_0 2.5) (<= (- Y_1 Y_0) -1)))\n"


def test_the_safe_set_is_the_negation_of_the_unsafe_constraints():
    c, d = safe_set(parse_query(UNSAFE, boxed=False))
    # unsafe: -Y_0 <= -2.5 or Y_1 - Y_0 <= -1; safe: Y_0 <= 2.5 and Y_0 - Y_1 <= 1
    assert c.tolist() == [[1.0, -0.0], [1.0, -1.0]] and d.tolist() == [2.5, 1.0]
    rng = np.random.default_rng(0)
    for y in rng.uniform(-4, 4, size=(200, 2)):
        unsafe = y[0] >= 2.5 or y[1] - y[0] <= -1
        assert np.all(c @ y <= d) == (not unsafe) or np.any(np.isclose(c @ y, d))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (OUTPUTS + "(assert (and (>= Y_0 1) (>= Y_1 1)))", "polytopes of \\[2\\] rows"),
        (OUTPUTS + "(assert (<= X_0 1)) (assert (>= Y_0 1))", "constrains the inputs"),
    ],
)
def test_properties_the_safe_set_cannot_express_are_refused(text, message):
    with pytest.raises(SpecError, match=message):
        safe_set(parse_query(text, boxed=False))


def test_verify_reach_takes_a_spec_as_it_takes_c_and_d(tmp_path, capsys):
    rng = np.random.default_rng(2)
    net = Network.from_arrays(
        [(rng.normal(size=(6, 2)), rng.normal(size=6)), (rng.normal(size=(2, 6)), np.zeros(2))]
    )
    (tmp_path / "m.onnx").write_bytes(net.to_onnx())
    for name, value in {"lower": -np.ones(2), "upper": np.ones(2)}.items():
        np.save(tmp_path / f"{name}.npy", value)
    spec = tmp_path / "p.vnnlib"
    spec.write_text(UNSAFE)
    c, d = safe_set(parse_query(UNSAFE, boxed=False))
    np.save(tmp_path / "C.npy", c)
    np.save(tmp_path / "d.npy", d)
    base = ["verify", "reach", "--model", str(tmp_path / "m.onnx")]
    base += ["--lower", str(tmp_path / "lower.npy"), "--upper", str(tmp_path / "upper.npy")]
    results = []
    for extra in (
        ["--spec", str(spec)],
        ["--C", str(tmp_path / "C.npy"), "--d", str(tmp_path / "d.npy")],
    ):
        assert main([*base, *extra]) == 0
        result = orjson.loads(capsys.readouterr().out)
        results.append((result["status"], result["coverage"], result["branches"]))
    assert results[0] == results[1]
    assert main([*base, "--spec", str(spec), "--C", str(tmp_path / "C.npy")]) == 2
    assert "--spec or --C and --d, not both" in capsys.readouterr().err


def test_a_reach_rule_reads_its_spec_file_relative_to_the_config(tmp_path):
    (tmp_path / "props").mkdir()
    (tmp_path / "props" / "p.vnnlib").write_text(UNSAFE)
    head = '[kafka]\nbootstrap_servers = "unused:9092"\n[[rules]]\nname = "v"\nkind = "reach"\n'
    head += 'topic = "t"\nmodel = "m"\nonnx = "m.onnx"\n'
    path = tmp_path / "vigil.toml"
    path.write_text(head + 'spec = "props/p.vnnlib"\n')
    (rule,) = load_config(path).rules
    assert rule.C == [[1.0, -0.0], [1.0, -1.0]] and rule.d == [2.5, 1.0]
    path.write_text(head + 'spec = "props/p.vnnlib"\nC = [[1.0, 0.0]]\nd = [1.0]\n')
    with pytest.raises(ConfigError, match="give spec or C and d, not both"):
        load_config(path)
    (tmp_path / "props" / "p.vnnlib").write_text(OUTPUTS + "(assert (and (>= Y_0 1) (>= Y_1 1)))")
    path.write_text(head + 'spec = "props/p.vnnlib"\n')
    with pytest.raises(ConfigError, match=r"rules.0.spec: .*p.vnnlib: the unsafe region must"):
        load_config(path)
    path.write_text(head)
    with pytest.raises(ConfigError, match="C and d, or spec"):
        load_config(path)
