"""VNN-LIB properties as queries (``query.Query``).

VNN-LIB 1.0, as VNN-COMP writes it, is read by the parser here: ``declare-const X_i`` /
``Y_j Real``, ``assert`` over linear comparisons (``<= >= < > =``, ``+ - *`` with constants)
joined by ``and`` / ``or`` in any nesting, comments, statements over several lines. VNN-LIB
2.0 (``(vnnlib-version <2.0>)``, ``declare-network``, indexed names ``X[0]``) is parsed by
the official ``vnnlib`` package; its syntax tree and disjunctive normal form are used per
assertion, and the assertions are intersected here (the package's own ``compat`` transform
joins separate ``and``/``or`` assertions as a union, and keeps only one half of ``==``).

VNN-LIB 1.0 keeps VNN-COMP's convention: strict comparisons are read as non-strict (the
unsafe region is closed), and a counterexample's output may lie 1e-4 outside it. In 2.0
strict comparisons are strict and there is no tolerance: a counterexample satisfies every
constraint as written. Bounds are computed over the closed region either way, which holds
the open one, so an ``unsat`` stays sound.
"""

from __future__ import annotations

import gzip
import itertools
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import vnnlib

from vigil.rules.reach.query import Query, Row, Variable, query_from_clauses
from vigil.rules.reach.sets import SpecError

MAX_CLAUSES = 100_000
V1_TOLERANCE = 1e-4
"""How far outside the unsafe region a VNN-LIB 1.0 counterexample's output may be: the
tolerance VNN-COMP checks counterexamples with."""
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_VAR = re.compile(r"^([XY])_(\d+)$")
_COMPARISONS = ("<=", ">=", "<", ">", "=")


def read_query(path: str | Path, boxed: bool = True) -> Query:
    """The query in a ``.vnnlib`` or ``.vnnlib.gz`` file (``boxed``: every input bounded)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror or e}") from e
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise SpecError(f"{path} is not gzip data: {e}") from e
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise SpecError(f"{path} is not UTF-8 text: {e}") from e
    return parse_query(text, boxed)


def parse_query(text: str, boxed: bool = True) -> Query:
    """A VNN-LIB 1.0 or 2.0 property; ``SpecError`` names what cannot be read."""
    if re.match(r"\s*(;[^\n]*\n\s*)*\(\s*vnnlib-version\b", text):
        return _parse_v2(text, boxed)
    return _parse_v1(text, boxed)


# -- VNN-LIB 1.0 -------------------------------------------------------------------------


def _parse_v1(text: str, boxed: bool) -> Query:
    statements = _read_sexprs(text)
    names: dict[str, list[int]] = {"X": [], "Y": []}
    asserts = []
    for s in statements:
        if not isinstance(s, list) or not s or not isinstance(s[0], str):
            raise SpecError(f"line {_line(s)}: expected a statement, got {_show(s)}")
        head = s[0]
        if head == "declare-const":
            if len(s) != 3 or not isinstance(s[1], str):
                raise SpecError(f"line {_line(s)}: (declare-const NAME Real) expected")
            match = _VAR.match(s[1])
            if match is None:
                raise SpecError(f"line {_line(s)}: variable {s[1]!r} is not X_i or Y_j")
            if s[2] != "Real":
                raise SpecError(f"line {_line(s)}: {s[1]} has type {_show(s[2])}, not Real")
            names[match.group(1)].append(int(match.group(2)))
        elif head == "assert":
            if len(s) != 2:
                raise SpecError(f"line {_line(s)}: (assert FORMULA) takes one formula")
            asserts.append(s[1])
        else:
            raise SpecError(f"line {_line(s)}: unknown statement {head!r}")
    sizes = {}
    for kind, indices in names.items():
        if sorted(indices) != list(range(len(indices))):
            raise SpecError(f"the {kind} variables are not declared as {kind}_0 ... {kind}_n")
        sizes[kind] = len(indices)
    if not sizes["X"] or not sizes["Y"]:
        raise SpecError("a property needs X_i inputs and Y_j outputs declared")
    if not asserts:
        raise SpecError("the property asserts nothing")
    reader = _V1(sizes["X"], sizes["Y"])
    variables = tuple(
        Variable(f"{kind}_{i}", "real", (), "input" if kind == "X" else "output", i)
        for kind in "XY"
        for i in range(sizes[kind])
    )
    clauses = _product([reader.dnf(a) for a in asserts])
    return query_from_clauses(clauses, sizes["X"], sizes["Y"], None, variables, boxed, V1_TOLERANCE)


class _Token(str):
    """An atom with the line it is on."""

    line: int


class _List(list):
    line: int


def _read_sexprs(text: str) -> list:
    stack: list[_List] = [_List()]
    stack[0].line = 1
    for number, raw in enumerate(text.splitlines(), 1):
        for token in _TOKEN.findall(raw.split(";", 1)[0]):
            if token == "(":
                new = _List()
                new.line = number
                stack[-1].append(new)
                stack.append(new)
            elif token == ")":
                if len(stack) == 1:
                    raise SpecError(f"line {number}: unbalanced ')'")
                stack.pop()
            else:
                atom = _Token(token)
                atom.line = number
                stack[-1].append(atom)
    if len(stack) > 1:
        raise SpecError(f"line {stack[-1].line}: '(' is never closed")
    return stack[0]


def _line(s) -> int | str:
    return getattr(s, "line", "?")


def _show(s) -> str:
    if isinstance(s, list):
        return "(" + " ".join(_show(x) for x in s) + ")"
    return str(s)


class _V1:
    """Formulas over X_0..X_{n-1}, Y_0..Y_{m-1} as disjunctive normal forms of rows."""

    def __init__(self, inputs: int, outputs: int) -> None:
        self.inputs, self.outputs = inputs, outputs

    def dnf(self, f) -> list[list[Row]]:
        if not isinstance(f, list) or not f:
            raise SpecError(f"line {_line(f)}: expected a formula, got {_show(f)}")
        head, args = f[0], f[1:]
        if head == "and":
            return _product([self.dnf(a) for a in args], f)
        if head == "or":
            return [clause for a in args for clause in self.dnf(a)]
        if head in _COMPARISONS:
            if len(args) != 2:
                raise SpecError(f"line {_line(f)}: {head} compares two terms")
            return [_rows(head, self.term(args[0]), self.term(args[1]))]
        raise SpecError(f"line {_line(f)}: unknown connective or comparison {_show(head)}")

    def term(self, t) -> tuple[np.ndarray, np.ndarray, float]:
        """A linear term as (coefficients on x, on y, constant)."""
        zero_x, zero_y = np.zeros(self.inputs), np.zeros(self.outputs)
        if isinstance(t, str):
            match = _VAR.match(t)
            if match:
                kind, index = match.group(1), int(match.group(2))
                vec = np.zeros(self.inputs if kind == "X" else self.outputs)
                if index >= vec.size:
                    raise SpecError(f"line {_line(t)}: {t} is not declared")
                vec[index] = 1.0
                return (vec, zero_y, 0.0) if kind == "X" else (zero_x, vec, 0.0)
            try:
                return zero_x, zero_y, float(t)
            except ValueError:
                raise SpecError(
                    f"line {_line(t)}: {t!r} is neither a variable nor a number"
                ) from None
        if not t or t[0] not in ("+", "-", "*"):
            raise SpecError(f"line {_line(t)}: expected a linear term, got {_show(t)}")
        parts = [self.term(a) for a in t[1:]]
        if not parts:
            raise SpecError(f"line {_line(t)}: {t[0]} needs arguments")
        if t[0] == "+":
            return _combine(parts, [1.0] * len(parts))
        if t[0] == "-":
            signs = [-1.0] if len(parts) == 1 else [1.0] + [-1.0] * (len(parts) - 1)
            return _combine(parts, signs)
        out = parts[0]
        for p in parts[1:]:
            if not (out[0].any() or out[1].any()):
                out = (p[0] * out[2], p[1] * out[2], p[2] * out[2])
            elif not (p[0].any() or p[1].any()):
                out = (out[0] * p[2], out[1] * p[2], out[2] * p[2])
            else:
                raise SpecError(f"line {_line(t)}: a product of two variables is not linear")
        return out


def _combine(parts, signs):
    return (
        sum(s * p[0] for s, p in zip(signs, parts, strict=True)),
        sum(s * p[1] for s, p in zip(signs, parts, strict=True)),
        sum(s * p[2] for s, p in zip(signs, parts, strict=True)),
    )


def _rows(op: str, left, right, strict: bool = False) -> list[Row]:
    """``left op right`` as rows ``a_x x + a_y y <= rhs`` (``<`` for ``<`` and ``>`` when
    ``strict``)."""
    a_x, a_y, const = left[0] - right[0], left[1] - right[1], left[2] - right[2]
    less = strict and op in ("<", ">")
    le: Row = (a_x, a_y, -const, less)  # left - right <= 0
    ge: Row = (-a_x, -a_y, const, less)  # right - left <= 0
    if op in ("<=", "<"):
        return [le]
    if op in (">=", ">"):
        return [ge]
    return [le, ge]


def _product(dnfs: list[list[list[Row]]], where=None) -> list[list[Row]]:
    total = 1
    for d in dnfs:
        total *= len(d)
    if total > MAX_CLAUSES:
        where = f"line {_line(where)}: " if where is not None else ""
        raise SpecError(
            f"{where}the formula has {total} disjuncts in normal form (at most {MAX_CLAUSES})"
        )
    return [[row for clause in combo for row in clause] for combo in itertools.product(*dnfs)]


# -- VNN-LIB 2.0 -------------------------------------------------------------------------


def _parse_v2(text: str, boxed: bool) -> Query:
    try:
        parsed = vnnlib.parse_query_string(text)
    except vnnlib.VNNLibException as e:
        raise SpecError(f"VNN-LIB 2.0: {e}") from None
    networks = list(parsed.networks)
    several = len(networks) > 1
    aliases, assertions = _aliases(networks, parsed.assertions)
    # X: every network's inputs flattened and joined in declaration order, an input the
    # query equates with an earlier one taking its place; Y: the outputs so joined, then
    # the hidden nodes (the order the importer gives them)
    shapes: dict[str, tuple[int, ...]] = {}
    offsets: dict[str, int] = {}
    inputs = outputs = 0
    for net in networks:
        for v in net.inputs:
            shapes[v.name] = tuple(v.shape)
            if v.name in aliases:
                offsets[v.name] = offsets[aliases[v.name]]
            else:
                offsets[v.name] = inputs
                inputs += int(np.prod(v.shape))
    for v in [v for net in networks for v in net.outputs] + [
        v for net in networks for v in net.hidden
    ]:
        shapes[v.name], offsets[v.name] = tuple(v.shape), outputs
        outputs += int(np.prod(v.shape))
    is_input = {v.name for net in networks for v in net.inputs}

    def linear(expr) -> tuple[np.ndarray, np.ndarray, float]:
        a_x, a_y = np.zeros(inputs), np.zeros(outputs)
        try:
            linear_expr = expr.to_linear_expr()
        except vnnlib.VNNLibException as e:
            raise SpecError(
                f"{expr}: {e}; polynomial arithmetic is not supported (the arithmetic "
                "theories answered are BND, OUTC and LIN)"
            ) from None
        for term in linear_expr.terms:
            var = term.var
            if var.name not in shapes:
                raise SpecError(f"{var.name} is not a declared variable")
            flat = offsets[var.name] + int(
                np.ravel_multi_index(tuple(var.indices), shapes[var.name])
            )
            (a_x if var.name in is_input else a_y)[flat] += term.coeff
        return a_x, a_y, float(linear_expr.constant)

    ops = {
        "LessEqual": "<=",
        "LessThan": "<",
        "GreaterEqual": ">=",
        "GreaterThan": ">",
        "Equal": "=",
    }
    dnfs = []
    for assertion in assertions:
        clauses = []
        for clause in assertion.expr.to_dnf():
            rows: list[Row] = []
            for comparison in clause:
                op = ops.get(type(comparison).__name__)
                if op is None:
                    raise SpecError(f"{comparison} is not supported (only <= < >= > ==)")
                rows += _rows(op, linear(comparison.lhs), linear(comparison.rhs), strict=True)
            clauses.append(rows)
        dnfs.append(clauses)
    if not dnfs:
        raise SpecError("the property asserts nothing")
    variables = tuple(
        Variable(v.name, _dtype(v.dtype), tuple(v.shape), role, offsets[v.name])
        for net in networks
        for role, declared in (
            ("input", net.inputs),
            ("hidden", net.hidden),
            ("output", net.outputs),
        )
        for v in declared
    )
    hidden = tuple(
        (f"{net.name}/" if several else "") + str(v.onnx_name).strip('"')
        for net in networks
        for v in net.hidden
    )
    position = {v.name: (n, k) for n, net in enumerate(networks) for k, v in enumerate(net.inputs)}
    query = query_from_clauses(_product(dnfs), inputs, outputs, networks[0].name, variables, boxed)
    return replace(
        query,
        hidden=hidden,
        networks=tuple((net.name, str(net.equal_to or "")) for net in networks),
        aliases=tuple((position[a], position[b]) for a, b in aliases.items()),
    )


def _aliases(networks: list, assertions: list) -> tuple[dict[str, str], list]:
    """Inputs the query equates element by element with an earlier declared input of the
    same shape, ``{later: earlier}`` (the networks then read one input: "compared on the
    same input"), and the assertions left once those equalities are taken out. Other
    equalities stay constraints."""
    declared = [v for net in networks for v in net.inputs]
    order = {v.name: k for k, v in enumerate(declared)}
    shapes = {v.name: tuple(v.shape) for v in declared}
    pairs: dict[tuple[str, str], set[tuple[int, ...]]] = {}
    kept = []
    for assertion in assertions:
        dnf = assertion.expr.to_dnf()
        found = [_element_pair(c, order) for c in dnf[0]] if len(dnf) == 1 else [None]
        if not found or any(f is None for f in found):
            kept.append(assertion)
            continue
        for (a, i), (b, j) in found:  # type: ignore[misc]
            if i == j and shapes[a] == shapes[b]:
                pairs.setdefault((a, b), set()).add(i)
    aliases = {}
    for (a, b), elements in pairs.items():
        if len(elements) == int(np.prod(shapes[a])) and b not in aliases:
            aliases[b] = aliases.get(a, a)
    if len(aliases) < len(pairs):  # some equalities only partial: keep them all as rows
        return {}, list(assertions)
    return aliases, kept


def _element_pair(comparison, order: dict[str, int]):
    """``(earlier, index), (later, index)`` when ``comparison`` is ``A[i] == B[j]`` between
    two declared inputs, else None."""
    if type(comparison).__name__ != "Equal":
        return None
    sides = []
    for side in (comparison.lhs, comparison.rhs):
        expr = side.to_linear_expr()
        if expr.constant or len(expr.terms) != 1 or expr.terms[0].coeff != 1:
            return None
        var = expr.terms[0].var
        if var.name not in order:
            return None
        sides.append((var.name, tuple(var.indices)))
    (a, i), (b, j) = sorted(sides, key=lambda side: order[side[0]])
    return None if a == b else ((a, i), (b, j))


def _dtype(dtype: vnnlib.DType) -> str:
    """A VNN-LIB element type as the standard spells it (``real``, ``float32``, ...)."""
    name = dtype.name
    if name == "Real":
        return "real"
    bits = re.match(r"^([FIUC])(\d+)$", name)
    if bits:
        kind = {"F": "float", "I": "int", "U": "uint", "C": "complex"}[bits.group(1)]
        return f"{kind}{bits.group(2)}"
    return name.lower()
