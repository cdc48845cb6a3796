"""Soundness on the Student data (the paper's Table 2 setting: target G3 >= 10, protected sex,
n = 1): nothing the abstract certifier certifies is refuted by enumerating every flipped
training set (and both sexes), and the accuracy versus enumeration is reported."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import SHARED_DATA
from vigil.rules.certify.knn import Enumerator, FairKnnCertifier, read_csv, split_target

STUDENT = SHARED_DATA / "student-por.csv"


@pytest.fixture(scope="module")
def student():
    if not STUDENT.exists():
        pytest.skip(f"shared data absent: {STUDENT}")
    features, labels = split_target(read_csv(STUDENT), "G3>=10")
    assert len(labels) == 649
    order = np.random.default_rng(0).permutation(len(labels))
    return features, labels, order[:80], order[80:]


@pytest.mark.shared_data
@pytest.mark.parametrize("ks", [list(range(3, 22, 2)), None], ids=["k3-21", "default-k"])
def test_student_certified_inputs_are_truly_fair(student, ks):
    features, labels, test, train = student
    cert = FairKnnCertifier.from_table(features.take(train), labels[train], ["sex"], 1, ks=ks)
    x = cert.encoder.transform(features.take(test))
    enumerator = Enumerator(cert.model, 1)
    assert len(enumerator.labels) == len(train) + 1
    for variant in ("label", "individual"):
        got = np.array([c.certified for c in cert.certify(x, variant)])
        truth = np.array(cert.ground_truth(x, variant, enumerator))
        unsound = int((got & ~truth).sum())
        accuracy = got.sum() / truth.sum()
        print(
            f"student n=1 {variant} k={cert.model.ks.tolist()}: certified {got.mean():.1%}, "
            f"truth {truth.mean():.1%}, accuracy {accuracy:.1%}, unsound {unsound}"
        )
        assert unsound == 0
        assert accuracy > 0.5  # the abstraction certifies most truly fair decisions
