"""HiGHS's feasibility-jump heuristic on the complete search's finisher MILPs, on and off.

    python bench/milp_heuristics.py [--data ../shared/data/acasxu] [--network 3_3]
                                    [--prop 2] [--seconds 20] [--every 50] [--repeats 5]

ACAS Xu property 2 on a network near a tie sends thousands of bisected boxes to the MILP
(rules/reach/milp.py). The search runs for ``--seconds`` and every ``--every``-th model is
written out as it is solved; each is then solved again with the heuristic on (HiGHS's
default since 1.11) and off (the finisher's setting), alternating, ``--repeats`` times each,
on one thread without presolve as the finisher runs them. Prints the median milliseconds a
solve takes with each setting and the median of the per-model ratios; the script fails
unless every model gets the same verdict both ways.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vigil.rules import relu_milp  # noqa: E402
from vigil.rules.highs import quiet_highs  # noqa: E402
from vigil.rules.reach.complete import verify  # noqa: E402
from vigil.rules.reach.rounding import load_for  # noqa: E402
from vigil.rules.reach.vnnlib import read_query  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "acasxu"
OPTION = "mip_heuristic_run_feasibility_jump"


def capture(
    data: Path, network: str, prop: int, seconds: float, every: int, out: Path
) -> list[Path]:
    """Run the search, writing every ``every``-th finisher MILP to ``out``; their files."""
    query = read_query(data / f"prop_{prop}.vnnlib")
    model = data / f"ACASXU_run2a_{network}_batch_2000.onnx"
    net, runner = load_for(model, query.element_type, query.hidden)
    solve, count = relu_milp.ReluModel.solve_milp, [0]

    def writing(self: relu_milp.ReluModel) -> object:
        self._set_integral(True)
        count[0] += 1
        if count[0] % every == 0:
            self.h.writeModel(str(out / f"{count[0]:06d}.mps"))
        return solve(self)

    relu_milp.ReluModel.solve_milp = writing
    try:
        verify(net, query, runner, timeout=seconds)
    finally:
        relu_milp.ReluModel.solve_milp = solve
    return sorted(out.glob("*.mps"))


def solve_once(path: Path, heuristic: bool) -> tuple[float, str]:
    h = quiet_highs()
    h.setOptionValue("presolve", "off")
    h.setOptionValue(OPTION, heuristic)
    h.readModel(str(path))
    started = time.perf_counter()
    h.run()
    return time.perf_counter() - started, h.modelStatusToString(h.getModelStatus())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--network", default="3_3")
    p.add_argument("--prop", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    if not (args.data / "acasxu_instances.csv").exists():
        print(f"no {args.data}: the ACAS Xu benchmark is not there", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        models = capture(args.data, args.network, args.prop, args.seconds, args.every, Path(tmp))
        print(f"{len(models)} finisher MILPs of {args.network} property {args.prop} "
              f"({args.seconds:g} s of search, every {args.every}th), {args.repeats} solves "
              "each way")  # fmt: skip
        if not models:
            print("no MILP was reached: give the search more --seconds", file=sys.stderr)
            return 1
        times: dict[bool, list[float]] = {True: [], False: []}
        ratios = []
        for path in models:
            per: dict[bool, list[float]] = {True: [], False: []}
            verdicts = set()
            for _ in range(args.repeats):
                for heuristic in (True, False):
                    seconds, status = solve_once(path, heuristic)
                    per[heuristic].append(seconds)
                    verdicts.add(status)
            if len(verdicts) != 1:
                print(f"{path.name}: verdicts differ: {sorted(verdicts)}", file=sys.stderr)
                return 1
            for heuristic in (True, False):
                times[heuristic].append(statistics.median(per[heuristic]))
            ratios.append(statistics.median(per[True]) / statistics.median(per[False]))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"feasibility jump on (HiGHS's default): {1e3 * on:7.2f} ms median per MILP")
    print(f"feasibility jump off (the finisher's): {1e3 * off:7.2f} ms median per MILP")
    print(f"on / off, median over the models:      {statistics.median(ratios):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
