"""Where the report's alerts come from: a JSON-lines file, or a Kafka topic named as
``kafka://HOST:PORT[,HOST:PORT...]/TOPIC``."""

from __future__ import annotations

SCHEME = "kafka://"


def parse_url(text: str) -> tuple[str, str]:
    """``kafka://HOST:PORT[,HOST:PORT...]/TOPIC`` -> (bootstrap servers, topic)."""
    servers, _, topic = text.removeprefix(SCHEME).partition("/")
    if not text.startswith(SCHEME) or not servers or not topic or "/" in topic:
        raise ValueError(f"{text}: expected kafka://HOST:PORT/TOPIC")
    return servers, topic
