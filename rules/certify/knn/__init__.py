"""FairKNN: certify that a KNN decision is unchanged under biased training labels, protected
attribute changes and small numeric perturbations (see docs/knn.md)."""

from vigil.rules.certify.knn.certifier import (
    VARIANTS,
    Certificate,
    FairKnnCertifier,
    default_candidates,
)
from vigil.rules.certify.knn.encoding import Encoder
from vigil.rules.certify.knn.enumeration import Enumerator
from vigil.rules.certify.knn.errors import KnnInputError
from vigil.rules.certify.knn.knn import KnnModel
from vigil.rules.certify.knn.table import Table, read_csv, split_target

__all__ = [
    "VARIANTS",
    "Certificate",
    "Encoder",
    "Enumerator",
    "FairKnnCertifier",
    "KnnInputError",
    "KnnModel",
    "Table",
    "default_candidates",
    "read_csv",
    "split_target",
]
