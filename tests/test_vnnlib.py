"""VNN-LIB 1.0 (our parser) and 2.0 (the official package) read into queries: boxes and
unsafe polytopes, checked against the formula evaluated directly."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.rules.reach.sets import SpecError
from vigil.rules.reach.vnnlib import parse_query, read_query

HEADER_1 = "".join(f"(declare-const X_{i} Real)\n" for i in range(2)) + "".join(
    f"(declare-const Y_{j} Real)\n" for j in range(2)
)


def test_every_acasxu_property_reads_as_its_file_states(acasxu):
    for number in range(1, 11):
        path = acasxu / f"prop_{number}.vnnlib"
        text = path.read_text()
        query = read_query(path)
        assert (query.inputs, query.outputs) == (5, 5)
        # the file's own bound literals are the boxes' bounds
        literals = {float(v) for v in re.findall(r"\((?:<=|>=) X_\d+ (-?[\d.]+)\)", text)}
        bounds = {float(v) for c in query.cases for v in (*c.lower, *c.upper)}
        assert bounds <= literals
        input_ors = 2 if number == 6 else 1
        assert len(query.cases) == input_ors
    prop1 = read_query(acasxu / "prop_1.vnnlib").cases[0]
    ((c, d),) = prop1.unsafe
    assert c.tolist() == [[-1.0, 0, 0, 0, 0]] and d[0] == pytest.approx(-3.991125645861615)
    prop2 = read_query(acasxu / "prop_2.vnnlib").cases[0]
    ((c, d),) = prop2.unsafe  # Y_0 is the largest: four rows Y_j - Y_0 <= 0
    assert c.shape == (4, 5) and np.all(c[:, 0] == -1) and np.all(d == 0)
    assert [len(read_query(acasxu / f"prop_{n}.vnnlib").cases[0].unsafe) for n in (5, 7, 8)] == [
        4,
        2,
        3,
    ]
    for case in read_query(acasxu / "prop_6.vnnlib").cases:  # two boxes, four polytopes each
        assert len(case.unsafe) == 4


def test_statements_over_lines_comments_terms_and_equalities():
    query = parse_query(
        HEADER_1
        + """; a comment (with parentheses) that must be ignored
        (assert (<= X_0 1))  (assert (>= X_0 -1)) ; two on a line
        (assert (and (<= X_1 2.5)
                     (>= X_1 0)))
        (assert (or (and (<= (+ Y_0 (* 2 Y_1)) 3))
                    (= Y_1 0.5)))
        """
    )
    (case,) = query.cases
    assert case.lower.tolist() == [-1, 0] and case.upper.tolist() == [1, 2.5]
    first, second = case.unsafe
    assert first[0].tolist() == [[1, 2]] and first[1].tolist() == [3]
    assert second[0].tolist() == [[0, 1], [0, -1]] and second[1].tolist() == [0.5, -0.5]


def test_rows_combining_inputs_range_over_outputs_then_inputs():
    box = "(assert (>= X_0 -1)) (assert (<= X_0 1)) (assert (>= X_1 0)) (assert (<= X_1 2))"
    query = parse_query(HEADER_1 + box + "(assert (<= (+ X_0 Y_1) 1)) (assert (>= Y_0 X_1))")
    (case,) = query.cases
    assert query.joint and query.outputs == 4  # (Y_0, Y_1, X_0, X_1)
    assert case.lower.tolist() == [-1, 0] and case.upper.tolist() == [1, 2]
    assert case.unsafe[0][0].tolist() == [[0, 1, 1, 0], [-1, 0, 0, 1]]
    assert query.counterexample([0.5, 1.0], [2.0, 0.5]) and not query.counterexample(
        [0.5, 1.0], [0.5, 0.5]
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("(assert (<= X_0 1)", "never closed"),
        ("(assert (<= X_7 1))", "X_7 is not declared"),
        ("(assert (<= (* Y_0 Y_1) 1))", "product of two variables"),
        ("(assert (<= X_0 1)) (assert (>= X_0 0)) (assert (<= Y_0 1))", "input 1 has no"),
        ("(assert (xor (<= Y_0 1)))", "unknown connective"),
        ("(check-sat)", "unknown statement 'check-sat'"),
    ],
)
def test_bad_properties_are_named(body, message):
    with pytest.raises(SpecError, match=message):
        parse_query(HEADER_1 + body)


def test_gzip_files_read_like_plain_ones(tmp_path, acasxu):
    plain = acasxu / "prop_7.vnnlib"
    packed = tmp_path / "prop_7.vnnlib.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = read_query(plain), read_query(packed)
    assert [(c.lower.tolist(), [p[0].tolist() for p in c.unsafe]) for c in a.cases] == [
        (c.lower.tolist(), [p[0].tolist() for p in c.unsafe]) for c in b.cases
    ]
    (tmp_path / "bad.vnnlib.gz").write_bytes(b"not gzip")
    with pytest.raises(SpecError, match="not gzip"):
        read_query(tmp_path / "bad.vnnlib.gz")


V2 = """(vnnlib-version <2.0>)
(declare-network acas
  (declare-input X real [1,5])
  (declare-output Y real [1,5]))
{asserts}
"""


def test_a_vnnlib_2_query_reads_as_its_1_0_twin():
    bounds = [(-0.3, 0.68), (-0.5, 0.5), (-0.5, 0.5), (-0.5, 0.5), (-0.5, 0.5)]
    v1 = "".join(f"(declare-const X_{i} Real)\n" for i in range(5))
    v1 += "".join(f"(declare-const Y_{j} Real)\n" for j in range(5))
    v2 = []
    for i, (lo, hi) in enumerate(bounds):
        v1 += f"(assert (>= X_{i} {lo})) (assert (<= X_{i} {hi}))\n"
        v2.append(f"(assert (>= X[0,{i}] {lo})) (assert (<= X[0,{i}] {hi}))")
    v1 += "(assert (or (and (<= Y_3 Y_0) (<= Y_3 Y_1)) (and (<= Y_4 Y_2) (>= Y_4 -1.5))))"
    v2.append(
        "(assert (or (and (<= Y[0,3] Y[0,0]) (<= Y[0,3] Y[0,1])) "
        "(and (<= Y[0,4] Y[0,2]) (>= Y[0,4] -1.5))))"
    )
    a, b = parse_query(v1), parse_query(V2.format(asserts="\n".join(v2)))
    (ca,), (cb,) = a.cases, b.cases
    np.testing.assert_array_equal(ca.lower, cb.lower)
    np.testing.assert_array_equal(ca.upper, cb.upper)
    for (c1, d1), (c2, d2) in zip(ca.unsafe, cb.unsafe, strict=True):
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_array_equal(d1, d2)


def test_vnnlib_2_assertions_are_intersected_and_equalities_kept_whole():
    asserts = "\n".join(
        [
            *(f"(assert (>= X[0,{i}] 0.0)) (assert (<= X[0,{i}] 1.0))" for i in range(5)),
            "(assert (or (<= X[0,0] 0.5) (>= X[0,0] 0.75)))",
            "(assert (or (== Y[0,0] 1.0) (<= Y[0,1] -2.0)))",
        ]
    )
    query = parse_query(V2.format(asserts=asserts))
    assert len(query.cases) == 2  # two boxes for X_0, each with both output polytopes
    x_in, x_out = np.full(5, 0.25), np.full(5, 0.6)
    y_eq, y_near = np.array([1.0, 0, 0, 0, 0]), np.array([1.5, 0, 0, 0, 0])
    assert query.counterexample(x_in, y_eq) and not query.counterexample(x_in, y_near)
    assert not query.counterexample(x_out, y_eq)  # X_0 = 0.6 is in neither box


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (V2.format(asserts="(assert (<= X[0,9] 1.0))"), "VNN-LIB 2.0"),
        (V2.format(asserts="(assert (<= X[0,0] 1.0)").replace("))\n", ")\n"), "VNN-LIB 2.0"),
        (
            V2.format(asserts="(assert (!= Y[0,0] 1.0)) (assert (<= X[0,0] 1.0))"),
            "not supported",
        ),
    ],
)
def test_bad_vnnlib_2_queries_are_named(text, message):
    with pytest.raises(SpecError, match=message):
        parse_query(text)


# -- the formula as written against the query it becomes --------------------------------

atoms = st.tuples(
    st.sampled_from(["<=", ">=", "="]),
    st.sampled_from(["Y_0", "Y_1", "(+ Y_0 Y_1)", "(- Y_1)"]),
    st.integers(-2, 2),
)


def formulas(depth: int = 2):
    if depth == 0:
        return atoms
    return st.one_of(
        atoms,
        st.tuples(
            st.sampled_from(["and", "or"]), st.lists(formulas(depth - 1), min_size=1, max_size=3)
        ),
    )


def _text(f) -> str:
    if f[0] in ("and", "or"):
        return f"({f[0]} {' '.join(_text(g) for g in f[1])})"
    op, term, const = f
    return f"({op} {term} {const})"


def _holds(f, y) -> bool:
    if f[0] == "and":
        return all(_holds(g, y) for g in f[1])
    if f[0] == "or":
        return any(_holds(g, y) for g in f[1])
    op, term, const = f
    value = {"Y_0": y[0], "Y_1": y[1], "(+ Y_0 Y_1)": y[0] + y[1], "(- Y_1)": -y[1]}[term]
    return {"<=": value <= const, ">=": value >= const, "=": value == const}[op]


@settings(max_examples=60, deadline=None)
@given(st.lists(formulas(), min_size=1, max_size=3), st.integers(0, 2**32 - 1))
def test_a_query_holds_exactly_where_its_formula_does(fs, seed):
    text = HEADER_1 + "(assert (<= X_0 1)) (assert (>= X_0 0))"
    text += "(assert (<= X_1 1)) (assert (>= X_1 0))"
    text += "".join(f"(assert {_text(f)})" for f in fs)
    try:
        query = parse_query(text)
    except SpecError as e:
        assert "disjuncts" in str(e)
        return
    rng = np.random.default_rng(seed)
    ys = rng.integers(-3, 4, size=(40, 2)).astype(float)  # integers: hit the equalities
    x = np.array([0.5, 0.5])
    for y in ys:
        assert query.counterexample(x, y) == all(_holds(f, y) for f in fs), (_text(fs[0]), y)
