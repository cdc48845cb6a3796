"""ONNX graphs as ReLU networks: one importer, one converter per operator family."""

from vigil.rules.graph.importer import Imported, import_graph
from vigil.rules.graph.ops import CONVERTERS
from vigil.rules.graph.values import UnsupportedModel

__all__ = ["CONVERTERS", "Imported", "UnsupportedModel", "import_graph"]
