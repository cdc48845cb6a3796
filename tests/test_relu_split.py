"""The complete search on networks with many inputs (branch and bound over ReLUs): verdicts
against the independent MILP oracle, the bounds of sign-assuming branches against sampled
points, the MILP-tightened bounds of the whole box against the oracle's exact ones, the MILP
on its own thread (its answer, and its stop), and `vigil verify vnnlib`'s time and memory
limits on an image-sized network."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import orjson
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from tests.milp_oracle import interval_bounds, max_violation
from vigil.rules.reach import complete, relu_split
from vigil.rules.reach.backward import SplitBounds, pre_activation_bounds, split_bounds
from vigil.rules.reach.complete import splits_inputs, verify
from vigil.rules.reach.milp import box_counterexample, milp_bounds
from vigil.rules.reach.network import Network, OnnxRunner
from vigil.rules.reach.query import Case, Query
from vigil.rules.reach.sets import InputSet, OutputSpec
from vigil.rules.relu_milp import Stop


def random_network(rng: np.random.Generator, sizes: list[int], gain: float = 1.2) -> Network:
    return Network.from_arrays(
        [
            (rng.normal(size=(o, i)) * gain / np.sqrt(i), rng.normal(size=o) * 0.3)
            for i, o in itertools.pairwise(sizes)
        ]
    )


# Fixed examples that take every shape and both modes on both sides (a random instance can
# need more than the 120 s a verdict gets here, and shrinking one takes many minutes).
@settings(deadline=None, phases=[Phase.explicit])
@given(
    seed=st.integers(0, 2**32 - 1),
    side=st.sampled_from([-1, 1]),
    split_first=st.booleans(),
    shape=st.sampled_from(["row", "two rows", "or a row never met"]),
)
@example(seed=0, side=-1, split_first=False, shape="row")
@example(seed=0, side=1, split_first=False, shape="row")
@example(seed=605511, side=1, split_first=False, shape="two rows")
@example(seed=308699, side=-1, split_first=False, shape="or a row never met")
@example(seed=60876, side=1, split_first=True, shape="or a row never met")
@example(seed=252490, side=-1, split_first=True, shape="two rows")
def test_verdicts_on_120_inputs_and_240_relus_match_the_milp_oracle(seed, side, split_first, shape):
    """The least ``y_0 - y_1`` over a box the oracle finds, and a bound 5% of its distance
    from the centre's value on either side of it: ``sat`` with a counterexample onnxruntime
    confirms below it, ``unsat`` above. With ``split_first`` the MILP takes only branches
    with 4 unstable neurons fewer than the box has, so splits come first. The unsafe
    region is that row alone, with a second row every output meets, or in a disjunction
    with a row no output meets (interval bounds say which), so each of the MILP's
    encodings is taken."""
    rng = np.random.default_rng(seed)
    net = random_network(rng, [120, 120, 120, 4])
    assert not splits_inputs(net)
    centre = rng.uniform(0, 1, 120)
    lo, hi = centre - 0.01, centre + 0.01
    c = np.array([1.0, -1.0, 0.0, 0.0])
    least = -max_violation(net, InputSet(lo, hi), OutputSpec(-c[None], [0.0]))[0]
    at_centre = float(net.logits(centre[None])[0] @ c)
    d = least + side * 0.05 * abs(at_centre - least)
    other = np.array([0.0, 0.0, 1.0, -1.0])
    y_low, y_high = interval_bounds(net, lo, hi)[-1]
    reach = (np.where(other > 0, y_low, y_high) @ other, np.where(other > 0, y_high, y_low) @ other)
    unsafe = {
        "row": ((c[None], np.array([d])),),
        "two rows": ((np.vstack([c, other]), np.array([d, reach[1] + 1.0])),),
        "or a row never met": ((c[None], np.array([d])), (other[None], np.array([reach[0] - 1]))),
    }[shape]
    query = Query(120, 4, (Case(lo, hi, unsafe, tolerance=1e-4),))
    runner = OnnxRunner(net.to_onnx())
    saved = relu_split.MILP_UNSTABLE
    if split_first:
        pre = pre_activation_bounds(net, lo[None], hi[None])
        relu_split.MILP_UNSTABLE = max(sum(int(((a < 0) & (b > 0)).sum()) for a, b in pre) - 4, 0)
    try:
        verdict = verify(net, query, runner, timeout=120)
    finally:
        relu_split.MILP_UNSTABLE = saved
    assert verdict.result == ("sat" if side > 0 else "unsat"), verdict
    if side > 0:
        assert verdict.x is not None
        assert query.counterexample(verdict.x, runner(verdict.x[None])[0])
    if split_first and side < 0:
        assert verdict.stats["splits"] > 0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 3))
# a branch whose second layer is constant: its neurons' interval and back-substituted bounds
# differed by rounding, and the branch was found empty
@example(seed=21169, depth=3)
def test_a_branchs_bounds_hold_at_every_sampled_point_that_meets_its_assumptions(seed, depth):
    """Random sign assumptions on random neurons: the points of the box whose
    pre-activations have the assumed signs stay under the branch's output bounds and inside
    its pre-activation bounds, and a branch found empty holds none of them."""
    rng = np.random.default_rng(seed)
    net = random_network(rng, [5, *rng.integers(4, 9, size=depth), 3], gain=1.5)
    lo = rng.uniform(-1, 0, 5)
    hi = lo + rng.uniform(0.1, 1, 5)
    branches = 6
    signs = [
        rng.choice([-1, 0, 0, 1], size=(branches, w)).astype(np.int8) for w in net.hidden_sizes
    ]
    C = rng.normal(size=(2, 3))
    bound = split_bounds(net, np.tile(lo, (branches, 1)), np.tile(hi, (branches, 1)), signs, C)
    assert_branches_hold(net, signs, bound, C, lo + (hi - lo) * rng.random((20_000, 5)))


def assert_branches_hold(
    net: Network, signs: list[np.ndarray], bound: SplitBounds, C: np.ndarray, x: np.ndarray
) -> None:
    """The points ``x`` that meet a branch's sign assumptions stay under its bounds of
    ``C y`` and inside its pre-activation bounds; a branch found empty holds none of them."""
    pre = net.pre_activations(x)
    y = net.logits(x)
    for b in range(len(bound.upper)):
        meets = np.ones(len(x), dtype=bool)
        for z, s in zip(pre, signs, strict=True):
            meets &= np.all((s[b] == 0) | ((s[b] > 0) & (z >= 0)) | ((s[b] < 0) & (z <= 0)), axis=1)
        if bound.empty[b]:
            assert not meets.any()
            continue
        assert np.all(y[meets] @ C.T <= bound.upper[b] + 1e-9)
        for z, (low, high) in zip(pre, bound.pre, strict=True):
            assert np.all(z[meets] >= low[b] - 1e-9) and np.all(z[meets] <= high[b] + 1e-9)


MEASURED = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, file=sys.stderr)
"""
"""Run a command and print its exit code and peak resident KiB last on stderr. Through this
small process because Linux counts, in a spawned process's ``ru_maxrss``, the memory its
parent (here the test run) held."""


def _image_sized_query(tmp_path) -> tuple:
    """A random 784-input network of six hidden layers of 256 ReLUs, and a property just
    beyond what gradient ascent reaches over a wide box: the bounds are far too loose to
    decide it in seconds."""
    rng = np.random.default_rng(7)
    net = random_network(rng, [784, *[256] * 6, 10], gain=1.4)
    centre = rng.uniform(0.1, 0.9, 784)
    lo, hi = np.clip(centre - 0.05, 0, 1), np.clip(centre + 0.05, 0, 1)
    model = tmp_path / "net.onnx"
    model.write_bytes(net.to_onnx())
    text = "".join(f"(declare-const X_{i} Real)\n" for i in range(784))
    text += "".join(f"(declare-const Y_{j} Real)\n" for j in range(10))
    for i in range(784):
        text += f"(assert (>= X_{i} {float(lo[i])!r}))\n(assert (<= X_{i} {float(hi[i])!r}))\n"
    # unsafe: Y_1 a little above the most sign-gradient ascent from 32 points reaches
    x = lo + (hi - lo) * rng.random((32, 784))
    for step in np.geomspace(0.2, 0.002, 60):
        pre = net.pre_activations(x)
        grad = np.tile(net.weights[-1][1], (len(x), 1))
        for w, z in zip(reversed(net.weights[:-1]), reversed(pre), strict=True):
            grad = (grad * (z > 0)) @ w
        x = np.clip(x + step * (hi - lo) * np.sign(grad), lo, hi)
    reached = net.logits(x)[:, 1].max()
    at_centre = net.logits(centre[None])[0, 1]
    text += f"(assert (>= Y_1 {reached + 0.1 * (reached - at_centre):.6f}))\n"
    spec = tmp_path / "prop.vnnlib"
    spec.write_text(text)
    return model, spec


def test_a_query_that_cannot_finish_answers_timeout_within_the_limits(tmp_path):
    """`--timeout 3 --memory-limit 256MB` on an image-sized network: `timeout` within 4 s
    of the process's start, its peak resident memory under 256 MB, the reason on stderr and
    no traceback."""
    model, spec = _image_sized_query(tmp_path)
    command = [
        sys.executable, "-m", "vigil.daemon.cli", "verify", "vnnlib", str(model), str(spec),
        "--timeout", "3", "--memory-limit", "256MB",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", MEASURED, *command], capture_output=True)
    took = time.monotonic() - started
    out, err = done.stdout.decode(), done.stderr.decode()
    code, peak_kib = map(int, err.splitlines()[-1].split())
    assert code == 0, err
    assert orjson.loads(out.splitlines()[-1])["result"] == "timeout", out[:300]
    assert took < 4.0, f"took {took:.2f} s"
    peak = peak_kib * 1024
    assert peak < 256_000_000, f"peak resident memory {peak / 1e6:.0f} MB"
    assert "vigil verify vnnlib: timeout after" in err and "branches still open" in err
    assert "Traceback" not in err


def test_a_memory_limit_below_what_loading_takes_is_named(tmp_path, capsys):
    from vigil.daemon.cli import main

    model, spec = _image_sized_query(tmp_path)
    code = main(["verify", "vnnlib", str(model), str(spec), "--memory-limit", "50MB"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--memory-limit 47 MiB leaves the search less than 32 MiB" in err


@pytest.mark.parametrize("size", ["lots", "-1GB", "0"])
def test_a_bad_memory_limit_is_refused_by_name(tmp_path, size, capsys):
    from vigil.daemon.cli import main

    with pytest.raises(SystemExit):
        main(["verify", "vnnlib", "m.onnx", "p.vnnlib", "--memory-limit", size])
    assert "--memory-limit" in capsys.readouterr().err


@pytest.mark.parametrize("cores", ["0", "two", "-1"])
def test_a_bad_core_count_is_refused_by_name(cores, capsys):
    from vigil.daemon.cli import main

    with pytest.raises(SystemExit):
        main(["verify", "vnnlib", "m.onnx", "p.vnnlib", "--cores", cores])
    assert "--cores: expected an integer >= 1" in capsys.readouterr().err


def test_the_open_branches_starts_stay_within_their_share_of_memory():
    """Relaxations to start from that would take the open branches past their quarter of
    the budget are dropped from the bottom of the stack (the longest waiting) and kept on
    top; a batch is taken all with starts or all without, so none is lost."""
    rng = np.random.default_rng(0)
    net = random_network(rng, [6, 8, 8, 2])
    case = Case(np.zeros(6), np.ones(6), ((np.array([[1.0, -1.0]]), np.array([0.0])),))
    rows = (np.array([[1.0, -1.0]]), np.array([0.0]), np.ones((1, 1), bool), np.zeros(1, bool))
    search = relu_split.ReluSplit(net, case, rows, None, {}, memory=1 << 20)  # type: ignore[arg-type]

    def part(first: int) -> relu_split.Branches:
        signs = np.zeros((4, 16), dtype=np.int8)
        signs[:, 0] = first
        start = rng.uniform(0, 1, size=(4, 2, 1, 16)).astype(np.float32)
        return relu_split.Branches(signs, np.ones((4, 1), bool), np.full(4, 9), start)

    search.stack = [part(i) for i in range(5)]
    per_part = search.stack[0].nbytes
    search.open_memory = 3 * per_part
    search._forget_starts()
    assert sum(p.nbytes for p in search.stack) <= search.open_memory
    kept = [p.start is not None for p in search.stack]
    assert kept == sorted(kept) and any(kept) and not all(kept)  # dropped from the bottom
    warm = relu_split._pop(search.stack, 100)
    assert warm.start is not None and len(warm.signs) == 4 * sum(kept)
    assert set(warm.signs[:, 0]) == {i for i, k in enumerate(kept) if k}
    cold = relu_split._pop(search.stack, 100)
    assert cold.start is None and len(cold.signs) == 4 * (5 - sum(kept))
    assert not search.stack


def _two_polytope_search() -> relu_split.ReluSplit:
    """A search over a small network (16 hidden neurons) with two unsafe polytopes of a row
    each, and nothing bounded yet."""
    rng = np.random.default_rng(0)
    net = random_network(rng, [6, 8, 8, 2])
    c = np.array([[1.0, -1.0], [-1.0, 1.0]])
    case = Case(np.zeros(6), np.ones(6), ((c[:1], np.array([5.0])), (c[1:], np.array([5.0]))))
    rows = (c, np.array([5.0, 5.0]), np.eye(2, dtype=bool), np.zeros(2, bool))
    return relu_split.ReluSplit(net, case, rows, None, {"milp": 0}, memory=1 << 20)  # type: ignore[arg-type]


def _answered(outcome: object, still_open: np.ndarray) -> Future:
    future: Future = Future()
    future.set_result((outcome, still_open))
    return future


def test_the_milp_s_answer_reaches_exactly_the_branches_below_its_branch():
    """The MILP decided a branch assuming neuron 0 active and neuron 3 inactive, while the
    search went on beneath it and beside it. Its answer is given to the branches below it
    (the ones that make the same assumptions, and more) and to no other: shown empty, they
    close; one polytope shown empty, they keep the other; the solver stopped at its limit,
    they go to the MILP again only once markedly smaller. A counterexample ends the search."""
    decided = np.zeros(16, dtype=np.int8)
    decided[[0, 3]] = [1, -1]
    below = np.tile(decided, (3, 1))
    below[:, 5] = [1, -1, 1]
    below[2, 9] = -1
    beside = np.zeros((3, 16), dtype=np.int8)
    beside[0, 0] = -1  # the other side of neuron 0
    beside[1, 0] = 1  # neuron 0 assumed, neuron 3 not: above the branch
    beside[2, [0, 3]] = [1, 1]

    def stacked(search: relu_split.ReluSplit) -> None:
        parts = [np.vstack([below[:2], beside[:2]]), np.vstack([beside[2:], below[2:]])]
        search.stack = [
            relu_split.Branches(
                signs, np.ones((len(signs), 2), bool), np.full(len(signs), 200), None
            )
            for signs in parts
        ]

    def signs_left(search: relu_split.ReluSplit) -> set[bytes]:
        return {row.tobytes() for part in search.stack for row in part.signs}

    search = _two_polytope_search()
    stacked(search)
    search.pending = relu_split._Pending(
        decided, 100, _answered("unsat", np.zeros(2, bool)), Stop(), {"milp": 3}
    )
    assert search._collect() is None and search.pending is None
    assert signs_left(search) == {row.tobytes() for row in beside}
    assert search.stats["milp"] == 3

    search = _two_polytope_search()
    stacked(search)
    search.pending = relu_split._Pending(
        decided, 100, _answered("unknown", np.array([True, False])), Stop(), {"milp": 1}
    )
    search._collect()
    assert search.waiting == 6
    for part in search.stack:
        for signs, open_, limit in zip(part.signs, part.open, part.limit, strict=True):
            is_below = any(np.array_equal(signs, row) for row in below)
            assert list(open_) == ([True, False] if is_below else [True, True])
            assert limit == (int(relu_split.MILP_SHRINK * 100) if is_below else 200)

    search = _two_polytope_search()
    stacked(search)
    found = (np.zeros(6), np.zeros(2))
    search.pending = relu_split._Pending(
        decided, 100, _answered(found, np.ones(2, bool)), Stop(), {"milp": 1}
    )
    assert search._collect() is found


def test_the_free_milp_takes_the_shallowest_kept_branch_with_open_branches_below():
    """Branches that qualified for the MILP while it was busy are kept; once it is free it
    takes the shallowest that still has open branches below it. After a MILP stopped at
    its limit, the kept branches below that one go only if markedly smaller."""
    search = _two_polytope_search()
    search.finisher = relu_split._Inline()
    taken = []

    def milp(bounds, open_, order, deadline, stop, counts, share):
        taken.append(bounds)
        assert share == relu_split.MILP_SHARE  # not the whole box's
        return "unknown"

    search._milp = milp  # type: ignore[method-assign]

    def kept(assumed: dict[int, int], unstable: int, name: float) -> relu_split._Candidate:
        signs = np.zeros(16, dtype=np.int8)
        signs[list(assumed)] = list(assumed.values())
        bounds = [(np.full((1, 8), name), np.full((1, 8), name))] * 2
        return relu_split._Candidate(
            len(assumed), signs, unstable, bounds, np.ones(2, bool), np.arange(2)
        )

    open_signs = np.zeros((2, 16), dtype=np.int8)
    open_signs[:, [0, 1, 2]] = [[1, 1, 1], [1, -1, 1]]
    search.stack = [relu_split.Branches(open_signs, np.ones((2, 2), bool), np.full(2, 250), None)]
    search.candidates = [
        kept({0: 1, 1: 1}, 90, 2.0),  # depth 2
        kept({0: -1}, 100, 1.0),  # depth 1, nothing open below it
        kept({0: 1}, 100, 3.0),  # depth 1
        kept({0: 1, 1: -1}, 70, 4.0),
    ]
    search._offer(deadline=time.monotonic() + 60)
    assert taken[-1][0][0][0, 0] == 3.0  # {0: 1}: the shallowest with open branches below
    assert [c.depth for c in search.candidates] == [2, 2]
    search._collect()  # "unknown" on a branch of 100: below it, at most 80 now
    assert [c.unstable for c in search.candidates] == [70]
    search._offer(deadline=time.monotonic() + 60)
    assert taken[-1][0][0][0, 0] == 4.0


def test_a_search_that_ends_stops_its_milp_and_leaves_no_thread(monkeypatch):
    """With two cores, the root goes to the MILP's thread and the bounds close every
    branch meanwhile: the verdict comes from the bounds at once, the MILP is stopped (here
    one that runs until it is), and no thread of the search outlives the call. With one
    core, the search runs each MILP on its own thread and waits for it."""
    rng = np.random.default_rng(3)
    net = random_network(rng, [40, 24, 24, 2])
    centre = rng.uniform(0, 1, 40)
    lo, hi = centre - 0.05, centre + 0.05
    c = np.array([[1.0, -1.0]])
    least = -max_violation(net, InputSet(lo, hi), OutputSpec(-c, [0.0]))[0]
    at_centre = float(net.logits(centre[None])[0] @ c[0])
    d = least - 0.05 * abs(at_centre - least)  # the root stays open: splits close it
    query = Query(40, 2, (Case(lo, hi, ((c, np.array([d])),)),))
    runner = OnnxRunner(net.to_onnx())
    running = threading.Event()

    def runs_until_stopped(self, case, lo, hi, c, d, seconds, bounds, any_row, stop):
        running.set()
        assert stop is not None and threading.current_thread().name.startswith("vigil-milp")
        while not stop.stopped:
            time.sleep(0.01)
        return "unknown"

    monkeypatch.setattr(complete._Search, "milp", runs_until_stopped)
    started = time.monotonic()
    verdict = verify(net, query, runner, timeout=60, cores=2)
    assert verdict.result == "unsat", verdict
    assert running.is_set() and verdict.stats["splits"] > 0
    assert time.monotonic() - started < 30
    assert not [t for t in threading.enumerate() if t.name.startswith("vigil-milp")]

    def on_the_search_s_thread(self, *args, **kwargs):
        assert threading.current_thread() is threading.main_thread()
        return "unknown"

    monkeypatch.setattr(complete._Search, "milp", on_the_search_s_thread)
    verdict = verify(net, query, runner, timeout=60, cores=1)
    assert verdict.result == "unsat" and verdict.stats["milp"] > 0, verdict


def _slow_milp() -> tuple:
    """A box of an image-sized network and a row its MILP cannot decide in seconds."""
    rng = np.random.default_rng(7)
    net = random_network(rng, [784, 256, 256, 10], gain=1.4)
    centre = rng.uniform(0.1, 0.9, 784)
    lo, hi = np.clip(centre - 0.05, 0, 1), np.clip(centre + 0.05, 0, 1)
    c = np.zeros((1, 10))
    c[0, :2] = [-1.0, 1.0]
    return net, lo, hi, c, np.array([float(net.logits(centre[None])[0] @ c[0]) - 5.0])


def test_a_stop_ends_a_highs_solve_under_way_on_another_thread():
    """HiGHS on a worker thread, on a MILP far from done, is stopped from this one: it
    answers "unknown" at once (not at its 60 s limit), and a later solve given the same
    stop does not start."""
    net, lo, hi, c, d = _slow_milp()
    stop = Stop()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(box_counterexample, net, lo, hi, c, d, 60.0, None, False, stop)
        time.sleep(3.0)
        assert not future.done()
        stopped = time.monotonic()
        stop()
        assert future.result(timeout=30)[0] == "unknown"
    assert time.monotonic() - stopped < 5.0
    started = time.monotonic()
    assert box_counterexample(net, lo, hi, c, d, 60.0, None, False, stop)[0] == "unknown"
    assert time.monotonic() - started < 5.0


def test_milps_on_two_threads_at_once_answer_as_one_at_a_time():
    """The search's own MILPs may run while the MILP's thread runs another: HiGHS keeps a
    scheduler per thread, so the answers on random boxes are those of the same MILPs run
    one after another."""
    rng = np.random.default_rng(11)
    problems = []
    for _ in range(8):
        net = random_network(rng, [12, 16, 16, 3])
        centre = rng.uniform(0, 1, 12)
        c = rng.normal(size=(1, 3))
        problems.append((net, centre - 0.1, centre + 0.1, c, np.array([rng.normal()])))
    alone = [box_counterexample(*p, 30.0)[0] for p in problems]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda p: box_counterexample(*p, 30.0)[0], problems))
    assert together == alone
    assert set(alone) == {"found", "infeasible"}


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), workers=st.sampled_from([1, 2]))
def test_milp_tightened_bounds_are_the_exact_ones(seed, workers):
    """With time enough for every MILP, each neuron unstable in the given bounds (after the
    first layer) gets the exact least pre-activation over the box, and its exact greatest
    unless the least is already >= 0; no bound ever moves outside the given ones or inside
    the exact range (the oracle: the same network cut after that layer, maximised by an
    independent MILP)."""
    rng = np.random.default_rng(seed)
    net = random_network(rng, [6, 8, 8, 8, 2], gain=1.5)
    centre = rng.uniform(-1, 1, 6)
    lo, hi = centre - 0.3, centre + 0.3
    given_bounds = pre_activation_bounds(net, lo[None], hi[None])
    tightened, count = milp_bounds(net, lo, hi, given_bounds, 10.0, time.monotonic() + 60, workers)
    assert count == sum(int(((low < 0) & (high > 0)).sum()) for low, high in given_bounds[1:])
    for k, ((low, high), (new_low, new_high)) in enumerate(
        zip(given_bounds, tightened, strict=True)
    ):
        cut = Network.from_arrays(list(zip(net.weights[: k + 1], net.biases[: k + 1], strict=True)))
        for j in range(low.shape[1]):
            row = np.eye(low.shape[1])[j : j + 1]
            most = max_violation(cut, InputSet(lo, hi), OutputSpec(row, [0.0]))[0]
            least = -max_violation(cut, InputSet(lo, hi), OutputSpec(-row, [0.0]))[0]
            tol = 1e-5 * (1 + abs(most) + abs(least))
            assert low[0, j] - tol <= new_low[0, j] <= least + tol
            assert most - tol <= new_high[0, j] <= high[0, j] + tol
            if k and low[0, j] < 0 < high[0, j]:
                assert new_low[0, j] == pytest.approx(least, abs=1e-3 * (1 + abs(least)))
                if least < 0:
                    assert new_high[0, j] == pytest.approx(most, abs=1e-3 * (1 + abs(most)))


def test_milp_tightening_past_its_time_keeps_the_bounds_it_was_given():
    rng = np.random.default_rng(3)
    net = random_network(rng, [6, 8, 8, 2], gain=1.5)
    lo, hi = np.zeros(6), np.ones(6)
    given_bounds = pre_activation_bounds(net, lo[None], hi[None])
    tightened, count = milp_bounds(net, lo, hi, given_bounds, 1.0, time.monotonic() - 1, 2)
    assert count == 0
    for (low, high), (new_low, new_high) in zip(given_bounds, tightened, strict=True):
        assert np.array_equal(low, new_low) and np.array_equal(high, new_high)


@settings(deadline=None, phases=[Phase.explicit])
@given(seed=st.integers(0, 2**32 - 1), side=st.sampled_from([-1, 1]))
@example(seed=5, side=-1)
@example(seed=5, side=1)
@example(seed=17, side=-1)
def test_a_search_that_tightens_its_box_first_still_matches_the_oracle(seed, side):
    """The search stopped at once for the MILP to tighten its box's bounds, then started
    again within them: ``sat`` (confirmed) below the oracle's least ``y_0 - y_1`` over the
    box, ``unsat`` above it, on three hidden layers (the last two tightened)."""
    rng = np.random.default_rng(seed)
    net = random_network(rng, [40, 30, 30, 30, 3], gain=1.5)
    centre = rng.uniform(0, 1, 40)
    lo, hi = centre - 0.05, centre + 0.05
    c = np.array([1.0, -1.0, 0.0])
    least = -max_violation(net, InputSet(lo, hi), OutputSpec(-c[None], [0.0]))[0]
    at_centre = float(net.logits(centre[None])[0] @ c)
    d = least + side * 0.05 * abs(at_centre - least)
    query = Query(40, 3, (Case(lo, hi, ((c[None], np.array([d])),), tolerance=1e-4),))
    runner = OnnxRunner(net.to_onnx())
    saved = relu_split.REFINE_AFTER, relu_split.MILP_UNSTABLE
    relu_split.REFINE_AFTER, relu_split.MILP_UNSTABLE = 0.0, 0  # splits alone decide
    try:
        verdict = verify(net, query, runner, timeout=120, cores=2)
    finally:
        relu_split.REFINE_AFTER, relu_split.MILP_UNSTABLE = saved
    assert verdict.result == ("sat" if side > 0 else "unsat"), verdict
    if side > 0:
        assert verdict.x is not None
        assert query.counterexample(verdict.x, runner(verdict.x[None])[0])
    else:
        assert verdict.stats["refined"] > 0
