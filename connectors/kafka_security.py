"""How Vigil's Kafka clients encrypt and authenticate, and what a refused connection means.

Every client (consumer, producer, the report's reader) takes its options from one
``KafkaSecurity``; secrets stay out of its ``repr`` and out of every message here.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.abc import AbstractTokenProvider
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError, SaslAuthenticationFailed, UnsupportedSaslMechanismError

from vigil.connectors.errors import BrokerRejected, BrokerUnavailable

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_HOSTNAME_MISMATCH = 62  # X509_V_ERR_HOSTNAME_MISMATCH


@dataclass(frozen=True)
class KafkaSecurity:
    """TLS and SASL settings shared by all of Vigil's Kafka clients."""

    protocol: str = "PLAINTEXT"
    cafile: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None
    key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    new_token_provider: Callable[[], AbstractTokenProvider] | None = None
    """OAUTHBEARER: makes the token provider of each client, which uses it in its own event
    loop (the producer's runs in a thread of its own): one provider shared by all would be
    used from two loops and two threads."""

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context for TLS protocols: the system's CAs unless ``cafile`` is set."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.cafile)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(
                f"ssl_cafile: cannot load CA certificates from {self.cafile}: {e}"
            ) from None
        if self.certfile:
            try:
                context.load_cert_chain(self.certfile, self.keyfile, self.key_password)
            except (ssl.SSLError, OSError) as e:
                raise ValueError(
                    f"ssl_certfile, ssl_keyfile: cannot load the client certificate "
                    f"{self.certfile} with key {self.keyfile} (or its ssl_key_password): {e}"
                ) from None
        context.check_hostname = self.check_hostname
        return context

    def client_options(self) -> dict[str, object]:
        """Keyword arguments for any aiokafka client."""
        options: dict[str, object] = {"security_protocol": self.protocol}
        if self.tls:
            options["ssl_context"] = self.ssl_context()
        if self.sasl:
            options["sasl_mechanism"] = self.mechanism
            if self.mechanism == "OAUTHBEARER":
                assert self.new_token_provider is not None
                options["sasl_oauth_token_provider"] = self.new_token_provider()
            else:
                options["sasl_plain_username"] = self.username
                options["sasl_plain_password"] = self.password
        return options

    def describe(self) -> str:
        """The settings in words, without secrets: ``SASL_SSL, SCRAM-SHA-512 as 'vigil'``."""
        parts = [self.protocol]
        if self.sasl:
            who = "" if self.mechanism == "OAUTHBEARER" else f" as {self.username!r}"
            parts.append(f"{self.mechanism}{who}")
        if self.certfile:
            parts.append("client certificate")
        return ", ".join(parts)


async def diagnose(servers: str, security: KafkaSecurity, timeout: float = 10.0) -> Exception:
    """Why no client could bootstrap from ``servers``: a ``BrokerRejected`` naming the
    setting to check, or a ``BrokerUnavailable``. aiokafka's own error only says it could
    not bootstrap, so one bare connection per address repeats the attempt and keeps its
    cause."""
    reasons = []
    for address in servers.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), **security.client_options()), timeout
            )
        except Exception as e:
            reason = _explain(e, address.strip(), security)
            if isinstance(reason, BrokerRejected):
                return reason
            reasons.append(str(reason))
        else:
            conn.close()
            reasons.append(f"{address.strip()} answers now (it did not a moment ago)")
    return BrokerUnavailable(f"cannot reach the Kafka broker at {servers}: {'; '.join(reasons)}")


def _causes(error: BaseException) -> list[BaseException]:
    chain = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _explain(error: BaseException, address: str, security: KafkaSecurity) -> Exception:
    if isinstance(error, TimeoutError):
        return BrokerUnavailable(f"{address}: no answer within the timeout")
    chain = _causes(error)
    at = f"Kafka broker {address} ({security.describe()})"
    for e in chain:
        if isinstance(e, SaslAuthenticationFailed):
            return BrokerRejected(
                f"{at}: authentication failed: check sasl_username and the password "
                "(sasl_password_file, or the VIGIL_KAFKA_SASL_PASSWORD variable)"
            )
        if isinstance(e, UnsupportedSaslMechanismError):
            return BrokerRejected(
                f"{at}: the broker does not accept SASL mechanism {security.mechanism}: "
                "check sasl_mechanism"
            )
        if isinstance(e, ssl.SSLCertVerificationError):
            if e.verify_code == _HOSTNAME_MISMATCH:
                return BrokerRejected(
                    f"{at}: the broker's certificate is not for this host name: connect by a "
                    "name the certificate lists, or (test setups only) ssl_check_hostname = false"
                )
            return BrokerRejected(
                f"{at}: the broker's certificate is not trusted ({e.verify_message}): set "
                "ssl_cafile to the CA that signed it"
            )
        if isinstance(e, ssl.SSLError):
            text = str(e).upper()
            if "WRONG_VERSION_NUMBER" in text or "RECORD_LAYER" in text:
                break
            if "CERTIFICATE" in text:
                return BrokerRejected(
                    f"{at}: the broker refused the client certificate ({e.reason}): this "
                    "listener wants mutual TLS; check ssl_certfile and ssl_keyfile"
                )
            return BrokerRejected(f"{at}: TLS failed ({e.reason}): check the ssl_* settings")
    if any(isinstance(e, ConnectionRefusedError | OSError) for e in chain) and not any(
        isinstance(e, ConnectionResetError | ssl.SSLError) for e in chain
    ):
        return BrokerUnavailable(f"{address}: {_first_line(chain)}")
    if security.tls:
        return BrokerRejected(
            f"{at}: the TLS handshake failed: is this a plaintext listener? check "
            "security_protocol and the port"
        )
    if any(isinstance(e, KafkaError | ConnectionResetError | EOFError) for e in chain):
        return BrokerRejected(
            f"{at}: the broker closed the connection at once: this listener probably wants "
            "TLS or SASL; check security_protocol and the port"
        )
    return BrokerUnavailable(f"{address}: {_first_line(chain)}")


def _first_line(chain: list[BaseException]) -> str:
    for e in chain:
        text = str(e).strip()
        if text:
            return text.splitlines()[0]
    return type(chain[0]).__name__
