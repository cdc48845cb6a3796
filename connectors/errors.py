"""Why a connection to the broker failed, importable without the Kafka client."""

from __future__ import annotations


class BrokerUnavailable(ConnectionError):
    """No broker answered at the configured address (a later retry may succeed)."""


class BrokerRejected(ConnectionError):
    """A broker answered but the connection's security settings do not fit it: wrong
    credentials, an untrusted certificate, TLS spoken to a plaintext port or the reverse.
    Retrying will not help; the configuration must change."""
