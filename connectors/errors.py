"""Why a connection to the broker failed, importable without the Kafka client."""

from __future__ import annotations


class BrokerUnavailable(ConnectionError):
    """No broker answered at the configured address (a later retry may succeed)."""


class BrokerRejected(ConnectionError):
    """A broker answered but the connection's security settings do not fit it: wrong
    credentials, an untrusted certificate, TLS spoken to a plaintext port or the reverse.
    Retrying will not help; the configuration must change."""


class MessageRefused(ValueError):
    """The broker or the client refused a message for its size. Retrying will not help:
    the topic's ``max.message.bytes`` (or the client's request limit) must be raised."""
