"""Vigil: runtime assurance for deployed AI models.

The package's parts live in the repository's top-level folders and install under this name:
``vigil.rules`` (pure algorithms), ``vigil.connectors`` (event I/O and contracts) and
``vigil.daemon`` (the service and the ``vigil`` command that wire them).
"""

__version__ = "0.2.0"
