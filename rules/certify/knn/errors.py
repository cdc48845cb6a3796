"""Errors raised on bad input to the KNN fairness certifier."""

from __future__ import annotations


class KnnInputError(ValueError):
    """A data set, option or request field the certifier cannot use; the message names it."""
