"""Every HiGHS model in a process can solve, whichever ran first.

HiGHS keeps one thread scheduler per process; a model whose ``threads`` option differs from
the one the scheduler was made for fails every solve (model status "Not Set"). Batch
verification failed so whenever the MILP oracle of the reach tests had solved first in the
same process; every model made here now runs on one thread.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SEQUENCE = """
import sys
import numpy as np
from tests.milp_oracle import max_violation
from vigil.rules.certify.batch.mipverify import ball_box, verify_ball
from vigil.rules.certify.cfx.highs import Milp
from vigil.rules.reach.network import Network
from vigil.rules.reach.sets import InputSet, OutputSpec

rng = np.random.default_rng(0)
net = Network.from_arrays(
    [(rng.normal(size=(4, 2)), rng.normal(size=4)), (rng.normal(size=(2, 4)), rng.normal(size=2))]
)
worst, _ = max_violation(net, InputSet(-np.ones(2), np.ones(2)), OutputSpec([[1.0, -1.0]], [0.0]))
milp = Milp()
x = milp.add_vars(0.0, 1.0, 2)
b = milp.add_binary()
milp.add_row(np.array([*x, b]), np.array([1.0, 1.0, 1.0]), 1.0, 2.0)
cheapest = milp.solve(np.array([1.0, 2.0, 0.5])).objective
centre = np.zeros(2)
label = int(np.argmax(net.logits(centre[None, :])[0]))
robust = verify_ball(net, ball_box(centre, 0.5, None), label).robust
print(cheapest, robust, file=sys.stderr)
"""


def test_the_oracle_a_counterfactual_milp_and_batch_verification_share_a_process():
    proc = subprocess.run(
        [sys.executable, "-c", SEQUENCE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == ""  # and no solver banner
    cheapest, robust = proc.stderr.split()[-2:]
    assert float(cheapest) == 0.5 and robust in ("True", "False")
