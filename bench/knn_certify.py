"""FairKNN certification rates and time per input (the paper's Table 3), next to the paper.

    python bench/knn_certify.py [--datasets student,german,compas,adult] [--inputs 100]
                                [--repeats 3] [--soundness]

Data (../shared/data): Student (G3 >= 10, protected sex, n = 1), German credit (german.data,
class good, protected: the sex part of attribute 9, n = 10), COMPAS and Adult (the Certifair
streams' ``label`` column, protected race or sex, n = 10 / 50). ``--inputs`` rows are held out
at random (seed 0) as test inputs, the rest is the training set; eps = 1% of each attribute's
range. The time per input is the median over ``--repeats`` runs of the mean abstract
prediction time with the full KSet (learning, once per data set, is listed separately).
The in-run baseline is the paper's own: naive enumeration of every flipped training set, timed
per input on Student; ``bound`` is the paper's single interval bound over protected values
(our default enumerates the protected values one by one).

``--soundness``: random small data sets and Student, certified versus enumerated (must show
zero unsound), with the accuracy (certified / truly fair) per variant.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streams import CERTIFAIR_ZIP, SHARED_DATA

from vigil.rules.certify.knn import Enumerator, FairKnnCertifier, Table, read_csv, split_target

PAPER = {  # Table 3: (label %, s), (+individual %, s), (+eps %, s)
    "Student (gender)": ((60.0, 0.2), (44.6, 0.2), (32.3, 0.2)),
    "German (gender)": ((48.0, 0.2), (44.0, 0.3), (43.0, 0.2)),
    "Compas (race)": ((95.0, 0.3), (62.4, 1.4), (56.4, 1.1)),
    "Compas (gender)": ((95.0, 0.3), (65.3, 1.3), (59.4, 1.0)),
    "Adult (race)": ((76.2, 2.2), (65.3, 4.5), (53.5, 5.3)),
    "Adult (gender)": ((76.2, 2.2), (52.5, 3.5), (43.6, 3.3)),
}
VARIANTS = ("label", "individual", "epsilon")
GERMAN_COLUMNS = [
    "status", "duration", "credit_history", "purpose", "credit_amount", "savings",
    "employment", "installment_rate", "personal_status_sex", "other_debtors",
    "residence_since", "property", "age", "other_installment", "housing", "existing_credits",
    "job", "people_liable", "telephone", "foreign_worker",
]  # fmt: skip
GERMAN_SEX = {"A91": "male", "A92": "female", "A93": "male", "A94": "male", "A95": "female"}
GERMAN_SINGLE = {"A91": "no", "A92": "no", "A93": "yes", "A94": "no", "A95": "yes"}


def student() -> tuple[Table, np.ndarray]:
    return split_target(read_csv(SHARED_DATA / "student-por.csv"), "G3>=10")


def german() -> tuple[Table, np.ndarray]:
    """Attribute 9 split into sex (protected) and single/not single, so that changing the sex
    leaves no contradicting status code behind."""
    rows, labels = [], []
    for line in (SHARED_DATA / "german.data").read_text().splitlines():
        cells = line.replace(",", " ").split()
        if not cells:
            continue
        status = cells[8]
        rows.append([*cells[:8], GERMAN_SINGLE[status], *cells[9:20], GERMAN_SEX[status]])
        labels.append(int(cells[20] == "1"))
    columns = [*GERMAN_COLUMNS[:8], "single", *GERMAN_COLUMNS[9:], "sex"]
    return Table(columns, rows), np.array(labels)


def stream(name: str) -> tuple[Table, np.ndarray]:
    with zipfile.ZipFile(CERTIFAIR_ZIP) as z:
        text = z.read(f"predictions/{name}-base-P1-combined.csv").decode()
    lines = text.splitlines()
    table = Table(lines[0].split(","), [line.split(",") for line in lines[1:]])
    return split_target(table.drop("prediction"), "label")


DATASETS = {  # name -> (loader, flips, [(row name, protected column)])
    "student": (student, 1, [("Student (gender)", "sex")]),
    "german": (german, 10, [("German (gender)", "sex")]),
    "compas": (
        lambda: stream("compas"),
        10,
        [("Compas (race)", "race"), ("Compas (gender)", "sex")],
    ),
    "adult": (lambda: stream("adult"), 50, [("Adult (race)", "race"), ("Adult (gender)", "sex")]),
}


def split(labels: np.ndarray, inputs: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(0).permutation(len(labels))
    return order[:inputs], order[inputs:]


def timed(cert: FairKnnCertifier, x: np.ndarray, variant: str, repeats: int, mode: str):
    """(certified flags, median over repeats of the mean seconds per input)."""
    runs = [cert.certify(x, variant, 0.01, mode) for _ in range(repeats)]
    per_input = [statistics.fmean(c.seconds for c in run) for run in runs]
    return np.array([c.certified for c in runs[0]]), statistics.median(per_input)


def table3(names: list[str], inputs: int, repeats: int, scaling: str) -> list[tuple]:
    """Prints Table 3; returns the data sets with race and sex for Table 4."""
    groups: list[tuple] = []
    header = (
        "| data set | n | K / KSet | learn s | variant | paper % | ours % | paper s/input "
        "| ours ms/input | speed-up | ours % (paper's protected bound) |"
    )
    print(header)
    print("|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        loader, flips, rows = DATASETS[name]
        features, labels = loader()
        test, train = split(labels, inputs)
        started = time.perf_counter()
        base = FairKnnCertifier.from_table(
            features.take(train), labels[train], [rows[0][1]], flips, scaling=scaling
        )
        learn = time.perf_counter() - started
        if len(rows) > 1:
            groups.append((name, base, features.take(test)))
        for row_name, protected in rows:
            cert = base.with_protected([protected])
            x = cert.encoder.transform(features.take(test))
            for i, variant in enumerate(VARIANTS):
                got, seconds = timed(cert, x, variant, repeats, "enumerate")
                bound = got if variant == "label" else timed(cert, x, variant, 1, "bound")[0]
                paper_rate, paper_s = PAPER[row_name][i]
                print(
                    f"| {row_name} | {flips} | {cert.k} / {cert.kset.tolist()} | {learn:.1f} "
                    f"| {variant} | {paper_rate:.1f} | {got.mean() * 100:.1f} | {paper_s:.1f} "
                    f"| {seconds * 1e3:.2f} | {paper_s / seconds:.0f}x "
                    f"| {bound.mean() * 100:.1f} |",
                    flush=True,
                )
    return groups


def table4(groups: list[tuple]) -> None:
    """Label-flipping + eps-fairness with race and sex both protected, per demographic group."""
    print("\n| data set (race and sex protected, +eps) | group | inputs | certified % |")
    print("|---|---|---:|---:|")
    for name, base, test in groups:
        cert = base.with_protected(["race", "sex"])
        got = np.array(
            [c.certified for c in cert.certify(cert.encoder.transform(test), "epsilon", 0.01)]
        )
        race = np.array(test.column("race"), dtype=float)
        sex = np.array(test.column("sex"), dtype=float)
        for r, s in sorted({(a, b) for a, b in zip(race, sex, strict=True)}):
            mask = (race == r) & (sex == s)
            print(
                f"| {name} | race={r:g}, sex={s:g} | {mask.sum()} | {got[mask].mean() * 100:.1f} |"
            )
        print(f"| {name} | all | {len(got)} | {got.mean() * 100:.1f} |")


def enumeration_baseline(inputs: int) -> None:
    """Per-input time of naive enumeration (the paper's baseline) versus ours, on Student."""
    features, labels = student()
    test, train = split(labels, inputs)
    cert = FairKnnCertifier.from_table(features.take(train), labels[train], ["sex"], 1)
    x = cert.encoder.transform(features.take(test))
    started = time.perf_counter()
    enumerator = Enumerator(cert.model, 1)
    setup = time.perf_counter() - started
    print("\n| Student, n = 1 | naive enumeration s/input | ours ms/input | speed-up |")
    print("|---|---:|---:|---:|")
    for variant in ("label", "individual"):
        started = time.perf_counter()
        cert.ground_truth(x, variant, enumerator)
        naive = (time.perf_counter() - started + setup) / len(x)
        _, ours = timed(cert, x, variant, 3, "enumerate")
        print(f"| {variant} | {naive:.4f} | {ours * 1e3:.3f} | {naive / ours:.0f}x |")


def random_problem(rng: np.random.Generator):
    size = int(rng.integers(12, 17))
    rows = [
        [int(rng.integers(0, 6)), round(float(rng.normal()), 1), str(rng.choice(["f", "m"]))]
        for _ in range(size)
    ]
    labels = np.array([int(r[0] + 2 * r[1] + rng.normal(0, 1.5) > 2.5) for r in rows])
    labels[0], labels[1] = 0, 1
    return Table(["a", "b", "sex"], rows), labels


def soundness(count: int) -> None:
    rng = np.random.default_rng(1)
    totals = {v: [0, 0, 0, 0] for v in ("label", "individual")}  # inputs, certified, fair, unsound
    for _ in range(count):
        table, labels = random_problem(rng)
        flips = int(rng.integers(1, 3))
        cert = FairKnnCertifier.from_table(table, labels, ["sex"], flips, ks=[3, 5, 7], folds=3)
        tests, _ = random_problem(rng)
        x = cert.encoder.transform(tests)
        enumerator = Enumerator(cert.model, flips)
        for v, t in totals.items():
            got = np.array([c.certified for c in cert.certify(x, v)])
            truth = np.array(cert.ground_truth(x, v, enumerator))
            t[0] += len(x)
            t[1] += int(got.sum())
            t[2] += int(truth.sum())
            t[3] += int((got & ~truth).sum())
    features, labels = student()
    test, train = split(labels, 100)
    print("\n| data | variant | inputs | certified | truly fair | unsound | accuracy |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for v, (n_in, cert_n, fair, bad) in totals.items():
        print(
            f"| {count} random sets (12-16 rows, n 1-2) | {v} | {n_in} | {cert_n} | {fair} "
            f"| {bad} | {cert_n / fair:.1%} |"
        )
    for ks in (list(range(3, 22, 2)), None):
        cert = FairKnnCertifier.from_table(features.take(train), labels[train], ["sex"], 1, ks=ks)
        x = cert.encoder.transform(features.take(test))
        enumerator = Enumerator(cert.model, 1)
        for v in ("label", "individual"):
            got = np.array([c.certified for c in cert.certify(x, v)])
            truth = np.array(cert.ground_truth(x, v, enumerator))
            print(
                f"| Student, n = 1, k {cert.model.ks.tolist()} | {v} | {len(x)} | {got.sum()} "
                f"| {truth.sum()} | {int((got & ~truth).sum())} | {got.sum() / truth.sum():.1%} |"
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default="student,german,compas,adult")
    p.add_argument("--inputs", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--soundness", action="store_true")
    p.add_argument("--scaling", choices=["standard", "minmax"], default="minmax")
    p.add_argument("--random-sets", type=int, default=200)
    args = p.parse_args()
    if not SHARED_DATA.exists():
        print(f"shared data absent: {SHARED_DATA}", file=sys.stderr)
        return 1
    if args.soundness:
        soundness(args.random_sets)
        return 0
    names = [d.strip() for d in args.datasets.split(",")]
    table4(table3(names, args.inputs, args.repeats, args.scaling))
    enumeration_baseline(args.inputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
