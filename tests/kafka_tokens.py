"""An OAUTHBEARER token provider for the dev broker, which accepts Kafka's unsigned test
tokens: ``sasl_oauth_token_provider = "tests.kafka_tokens:UnsignedToken"``."""

from __future__ import annotations

import asyncio
import base64
import json
import time

from aiokafka.abc import AbstractTokenProvider


def _part(claims: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()


class UnsignedToken(AbstractTokenProvider):
    """A JWT with ``alg: none`` for the principal ``vigil``, valid for an hour."""

    async def token(self) -> str:
        now = int(time.time())
        return f"{_part({'alg': 'none'})}.{_part({'sub': 'vigil', 'iat': now, 'exp': now + 3600})}."


class LoopBoundToken(UnsignedToken):
    """The same tokens from a provider bound to the event loop of its first call, as one
    holding that loop's HTTP session or lock is: a call from another loop is refused."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    async def token(self) -> str:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError("this token provider is bound to another event loop")
        return await super().token()
