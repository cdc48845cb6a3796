"""The daemon's TOML configuration, validated with pydantic; every error names its key."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, Union, get_args

import numpy as np
from aiokafka.abc import AbstractTokenProvider
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from vigil.connectors.kafka import PARTITION_FETCH_BYTES
from vigil.connectors.kafka_security import MECHANISMS, PROTOCOLS, KafkaSecurity
from vigil.connectors.serving import seldon
from vigil.daemon.offload import INSTALL_DASK, scheduler_address
from vigil.rules.ior.backends import parse_backend
from vigil.rules.reach.online import Accelerations
from vigil.rules.reach.query import safe_set
from vigil.rules.reach.sets import SpecError
from vigil.rules.reach.vnnlib import read_query

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
"""What a Kafka topic name may hold."""


class ConfigError(ValueError):
    """A configuration that cannot be used; the message lists each bad key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: object) -> object:
        """``eps = true`` is a mistake, not 1.0."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if isinstance(value, bool) and field and bool not in _types(field):
                    raise ValueError(f"{key}: expected a number, not {str(value).lower()}")
        return data


def _types(field: FieldInfo) -> set[object]:
    return {field.annotation, *get_args(field.annotation)}


class KafkaConfig(_Section):
    bootstrap_servers: str
    group_id: str = "vigil"
    exactly_once: bool = False
    transactional_id: str | None = Field(
        default=None, description="fixed per instance so a restart fences its predecessor"
    )
    client_id: str = "vigil"
    max_batch: Annotated[int, Field(ge=1)] = 5000
    decode_worker: bool = Field(
        default=True,
        description="read large batches' decision events (a backlog's) in a worker process "
        "while the batch before is checked; off on a single core",
    )
    fetch_timeout_ms: Annotated[int, Field(ge=1)] = 200
    fetch_max_wait_ms: Annotated[int, Field(ge=1)] = Field(
        default=20, description="how long the broker may hold a fetch for an idle partition"
    )
    max_partition_fetch_bytes: Annotated[int, Field(ge=64 << 10)] = Field(
        default=PARTITION_FETCH_BYTES,
        description="bytes one fetch may bring per partition, buffered until checked",
    )
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    session_timeout_ms: Annotated[int, Field(ge=1000)] = Field(
        default=10_000, description="how soon a crashed instance's partitions are reassigned"
    )
    startup_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        default=60.0,
        description="how long an unreachable broker is waited for at start-up and while "
        "partitions are recovered, before the daemon exits with status 1",
    )

    security_protocol: Literal[PROTOCOLS] = "PLAINTEXT"
    ssl_cafile: Path | None = Field(
        default=None,
        description="CA bundle that signed the brokers' certificates; system CAs if unset",
    )
    ssl_certfile: Path | None = Field(default=None, description="client certificate (mutual TLS)")
    ssl_keyfile: Path | None = Field(default=None, description="its private key")
    ssl_key_password: SecretStr | None = None
    ssl_key_password_file: Path | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: Literal[MECHANISMS] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    sasl_oauth_token_provider: str | None = Field(
        default=None,
        description="module:attribute, called with no arguments, giving an aiokafka "
        "AbstractTokenProvider (OAUTHBEARER)",
    )

    @model_validator(mode="after")
    def _security_fits(self) -> KafkaConfig:
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        sasl = self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")
        for key in (
            "ssl_cafile",
            "ssl_certfile",
            "ssl_keyfile",
            "ssl_key_password",
            "ssl_key_password_file",
        ):
            if getattr(self, key) is not None and not tls:
                raise ValueError(f"{key} is only used with security_protocol SSL or SASL_SSL")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (mutual TLS)")
        _one_secret(self, "ssl_key_password")
        sasl_keys = ("sasl_username", "sasl_password", "sasl_password_file")
        if not sasl:
            for key in ("sasl_mechanism", *sasl_keys, "sasl_oauth_token_provider"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"{key} is only used with security_protocol SASL_PLAINTEXT or SASL_SSL"
                    )
            return self
        if self.sasl_mechanism is None:
            raise ValueError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism "
                f"({', '.join(MECHANISMS)})"
            )
        if self.sasl_mechanism == "OAUTHBEARER":
            for key in sasl_keys:
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} is not used with OAUTHBEARER (the token provider is)")
            if self.sasl_oauth_token_provider is None:
                raise ValueError("OAUTHBEARER needs sasl_oauth_token_provider (module:attribute)")
            _import_attribute(self.sasl_oauth_token_provider)
            return self
        if self.sasl_oauth_token_provider is not None:
            raise ValueError("sasl_oauth_token_provider is only used with OAUTHBEARER")
        if not self.sasl_username:
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs sasl_username")
        _one_secret(self, "sasl_password", required=True)
        return self

    def security(self) -> KafkaSecurity:
        """The clients' TLS and SASL settings, with secrets read from their files or the
        environment now."""
        provider = None
        if self.sasl_oauth_token_provider:
            provider = _import_attribute(self.sasl_oauth_token_provider)
        return KafkaSecurity(
            protocol=self.security_protocol,
            cafile=self.ssl_cafile,
            certfile=self.ssl_certfile,
            keyfile=self.ssl_keyfile,
            key_password=_secret(self, "ssl_key_password"),
            check_hostname=self.ssl_check_hostname,
            mechanism=self.sasl_mechanism,
            username=self.sasl_username,
            password=_secret(self, "sasl_password"),
            new_token_provider=provider,
        )

    def instance_transactional_id(self, host: str) -> str:
        """The configured id, or one unique per host and stable across restarts there:
        ``<group_id>-<client_id>-<host>``. Instances sharing an id fence each other."""
        return self.transactional_id or f"{self.group_id}-{self.client_id}-{host}"


SECRET_VARIABLES = {
    "sasl_password": "VIGIL_KAFKA_SASL_PASSWORD",
    "ssl_key_password": "VIGIL_KAFKA_SSL_KEY_PASSWORD",
}


def _one_secret(kafka: KafkaConfig, key: str, required: bool = False) -> None:
    """A secret comes from ``<key>_file``, ``<key>`` or its environment variable."""
    inline, path = getattr(kafka, key), getattr(kafka, f"{key}_file")
    if inline is not None and path is not None:
        raise ValueError(f"{key} and {key}_file: set one (the file keeps it out of the TOML)")
    if required and inline is None and path is None and not os.environ.get(SECRET_VARIABLES[key]):
        raise ValueError(
            f"{key}_file is needed (or {key}, or the {SECRET_VARIABLES[key]} environment variable)"
        )


def _secret(kafka: KafkaConfig, key: str) -> str | None:
    inline, path = getattr(kafka, key), getattr(kafka, f"{key}_file")
    if path is not None:
        return _read_secret(path, f"{key}_file")
    if inline is not None:
        return inline.get_secret_value()
    return os.environ.get(SECRET_VARIABLES[key]) or None


def _read_secret(path: Path, key: str) -> str:
    """The file's text without its final line break."""
    try:
        text = path.read_text().rstrip("\r\n")
    except FileNotFoundError:
        raise ValueError(f"{key}: no such file: {path}") from None
    except OSError as e:
        raise ValueError(f"{key}: cannot read {path}: {e.strerror}") from None
    if not text:
        raise ValueError(f"{key}: {path} is empty")
    return text


def _import_attribute(spec: str) -> Callable[[], AbstractTokenProvider]:
    """``package.module:attribute``, imported: a token provider's class or factory."""
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise ValueError(f"sasl_oauth_token_provider: expected module:attribute, got {spec!r}")
    try:
        value = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"sasl_oauth_token_provider: cannot import {spec}: {e}") from None
    if not callable(value):
        raise ValueError(f"sasl_oauth_token_provider: {spec} is not callable")
    return value


class FilesConfig(_Section):
    """JSON-lines files instead of Kafka: the embedded default (no broker)."""

    decisions: Path
    topic: str = Field(default="decisions", description="the topic name rules refer to")
    max_batch: Annotated[int, Field(ge=1)] = 4096


class OutputsConfig(_Section):
    alerts_topic: str = "vigil.alerts"
    dead_letter_topic: str = "vigil.dead-letters"
    verifications_topic: str = "vigil.verifications"
    certifications_topic: str = "vigil.certifications"
    alerts_file: Path | None = None
    dead_letter_file: Path | None = None
    verifications_file: Path | None = None
    certifications_file: Path | None = None


class OffloadConfig(_Section):
    """The worker pool for certifications: local worker processes, or a Dask cluster's
    workers. Reach rules always keep their own local process (its verifier's state lives
    there between steps), whatever the engine."""

    engine: Literal["processes", "dask"] = Field(
        default="processes",
        description="where certify and cfx jobs run: local worker processes or a Dask cluster",
    )
    scheduler: str | None = Field(
        default=None,
        validate_default=True,
        description='the Dask scheduler, tcp://HOST:PORT (required with engine = "dask")',
    )
    workers: Annotated[int, Field(ge=1)] = Field(
        default=2, description="worker processes, or with dask the jobs on the cluster at once"
    )
    max_pending: Annotated[int, Field(ge=1)] = Field(
        default=64, description="jobs in flight before fetching pauses (backpressure)"
    )
    timeout_seconds: Annotated[float, Field(gt=0)] = 300.0
    nice: Annotated[int, Field(ge=0, le=19)] = Field(
        default=10, description="workers run this much below the daemon's CPU priority"
    )

    @field_validator("engine")
    @classmethod
    def _dask_installed(cls, value: str) -> str:
        if value == "dask" and importlib.util.find_spec("distributed") is None:
            raise ValueError(f"Dask distributed is not installed; {INSTALL_DASK}")
        return value

    @field_validator("scheduler")
    @classmethod
    def _scheduler_with_dask(cls, value: str | None, info: ValidationInfo) -> str | None:
        engine = info.data.get("engine")
        if engine == "dask" and value is None:
            raise ValueError('required with engine = "dask" (the scheduler, tcp://HOST:PORT)')
        if engine == "processes" and value is not None:
            raise ValueError('only used with engine = "dask"')
        return None if value is None else scheduler_address(value)


class MetricsConfig(_Section):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 9464
    enabled: bool = True
    ready_broker_grace_seconds: Annotated[float, Field(ge=0)] = Field(
        default=10.0,
        description="/readyz answers not ready once the broker has been unreachable this long",
    )


class StateConfig(_Section):
    store: Literal["file", "kafka"] = Field(
        default="file",
        description="where snapshots live: the local dir (one host's copy), or a compacted "
        "Kafka topic, so a partition's state moves with it to any instance ([kafka] only)",
    )
    topic: str | None = Field(
        default=None,
        min_length=1,
        description='the state topic of store = "kafka" (default: "<group_id>-state"); '
        "created compacted if missing",
    )
    chunk_bytes: Annotated[int, Field(ge=1024)] = Field(
        default=512 << 10,
        description="largest state record value; must fit the topic's max.message.bytes",
    )
    max_segments: Annotated[int, Field(ge=0)] = Field(
        default=32,
        description="segments written after a base before the next snapshot is a new base",
    )
    dir: Path = Path("vigil-state")
    snapshot_every_events: Annotated[int, Field(ge=1)] = 100_000
    snapshot_every_seconds: Annotated[float, Field(gt=0)] = 60.0
    keep: Annotated[int, Field(ge=1)] = 3
    on_history_gap: Literal["flag", "fail"] = Field(
        default="flag",
        description="a rule's history lacks records retention deleted: flag its alerts "
        "(history_complete = false) or stop the daemon",
    )

    def topic_for(self, group_id: str) -> str:
        """The state topic of a consumer group (one per group: its instances share it)."""
        return self.topic or f"{group_id}-state"


class ShutdownConfig(_Section):
    deadline_seconds: Annotated[float, Field(gt=0)] = 30.0


class SeldonConfig(_Section):
    """Where Seldon Core 2 writes its traffic: ``<prefix>.<namespace>.model.<model>.inputs``."""

    prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+$")] = "seldon"
    namespace: Annotated[str, Field(min_length=1)] = "default"

    def topics(self, rule: ServingKeys) -> tuple[str, str]:
        """A seldon rule's inputs and outputs topics."""
        assert rule.model is not None
        namespace = rule.seldon_namespace or self.namespace
        return seldon.topics(self.prefix, namespace, rule.seldon_kind, rule.model)


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class ServingKeys(_Section):
    """The keys of a rule that reads decisions, for where they come from: Vigil's events or a
    serving stack's traffic (docs/operations.md, "Connect your serving stack")."""

    name: Annotated[str, Field(min_length=1)]
    topic: str | None = Field(
        default=None, description='the decisions topic (not with format = "seldon")'
    )
    format: Literal["vigil", "seldon", "kserve"] = Field(
        default="vigil",
        description="what the topic holds: Vigil decision events, Seldon Core 2 model or "
        "pipeline traffic, or KServe inference-logger CloudEvents",
    )
    seldon_namespace: str | None = Field(
        default=None, description="the model's namespace, if not [seldon] namespace"
    )
    seldon_kind: Literal["model", "pipeline"] = "model"
    input_tensor: str | None = Field(
        default=None, description="the input tensor a decision's x is read from (the first)"
    )
    output_tensor: str | None = Field(
        default=None, description="the output tensor its label or probabilities are read from"
    )
    categories: dict[str, list[Annotated[str, Field(min_length=1)]]] = Field(
        default={}, description="a string tensor's values, one-hot encoded in this order"
    )
    join_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        default=300.0,
        description="a request (or response) unpaired this long in stream time is a dead letter",
    )
    join_pending_limit: Annotated[int, Field(ge=1)] = Field(
        default=100_000,
        description="records of one serving-stack partition read ahead of the others' time "
        "before reading it pauses",
    )
    merge_idle_seconds: Annotated[float, Field(ge=0)] = Field(
        default=5.0,
        description="how long the time-ordered merge of the serving stack's partitions waits "
        "for one that has records not yet fetched, before time moves past it",
    )

    def _check_format(self) -> None:
        serving = self.format != "vigil"
        if serving and not TOPIC_NAME.match(self.name):
            raise ValueError(
                f"name {self.name!r}: a serving-stack rule's name is part of its topics' "
                "names, so only letters, digits, '.', '_' and '-'"
            )
        if self.format == "seldon":
            if self.topic is not None:
                raise ValueError('format = "seldon" reads the model\'s topics: leave out topic')
        elif self.topic is None:
            raise ValueError(f'format = "{self.format}" needs topic')
        if serving and self.model is None:
            raise ValueError(f'format = "{self.format}" needs model (its traffic is read)')
        if serving and getattr(self, "input", "x") == "embedding":
            raise ValueError("input = 'embedding' reads Vigil decision events only")
        if not serving:
            for key in (
                "seldon_namespace",
                "input_tensor",
                "output_tensor",
                "categories",
                "join_timeout_seconds",
                "join_pending_limit",
                "merge_idle_seconds",
            ):
                if key in self.model_fields_set:
                    raise ValueError(f"{key} applies to format seldon or kserve")
        if self.format != "seldon" and (
            "seldon_namespace" in self.model_fields_set or "seldon_kind" in self.model_fields_set
        ):
            raise ValueError('seldon_namespace and seldon_kind apply to format = "seldon"')
        features = getattr(self, "features", None)
        if serving and features is not None and self.input_tensor is not None:
            raise ValueError("features (one tensor per column) and input_tensor exclude each other")


class IorRuleConfig(ServingKeys):
    kind: Literal["ior"]
    model: str | None = Field(default=None, description="only this model's decisions; all if unset")
    metric: Literal["linf", "l2", "l1"] = "linf"
    eps: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    backend: str = "auto"
    output: Literal["label", "probabilities"] = "label"
    delta: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    output_metric: Literal["linf", "l1", "tv"] = "linf"
    dim: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="input length; taken from the first valid decision if unset"
    )
    ignore: list[Annotated[int, Field(ge=0)]] = []
    scale: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = None
    input: Literal["x", "embedding"] = Field(
        default="x", description="compare the decisions' x, or their embedding vectors"
    )
    features: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        description="read the input from the decision's `features` object, in this order",
    )
    embedding_onnx: Path | None = Field(
        default=None,
        description="map each input through this ONNX model (its first input to its first "
        "output) and compare the embeddings",
    )
    quantitative: bool = Field(
        default=False, description="add each alert's largest d_out / d_in within eps"
    )
    ratio_threshold: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        default=None,
        description="alert only when that ratio exceeds this (implies quantitative)",
    )
    history_limit: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="decisions kept per partition (the oldest quarter dropped when full); "
        "every decision if unset",
    )
    max_witnesses: Annotated[int, Field(ge=1)] = Field(
        default=1000,
        description="witnesses per alert: a larger set keeps its nearest members and carries "
        "witness_count and witnesses_truncated (so the alert fits a Kafka message)",
    )

    @model_validator(mode="after")
    def _check(self) -> IorRuleConfig:
        parse_backend(self.backend)
        self._check_format()
        if self.output == "label" and self.delta:
            raise ValueError("delta applies to probability outputs only")
        if self.features is not None:
            if self.input != "x":
                raise ValueError("features and input = 'embedding' exclude each other")
            if not self.features or len(set(self.features)) != len(self.features):
                raise ValueError("features must name distinct inputs")
            if self.dim is not None and self.dim != self.input_dim:
                raise ValueError(f"dim is {self.dim}, features make {self.input_dim} columns")
        if self.embedding_onnx is not None:
            if self.input == "embedding":
                raise ValueError("embedding_onnx maps x or features; input = 'embedding' is one")
            if self.ignore or self.scale is not None:
                raise ValueError("ignore and scale do not apply with embedding_onnx")
        dim = self.input_dim
        if dim is not None:
            if any(i >= dim for i in self.ignore):
                raise ValueError(f"ignore has an index >= dim ({dim})")
            if self.scale is not None and len(self.scale) != dim:
                raise ValueError(f"scale has {len(self.scale)} entries, dim is {dim}")
        return self

    @property
    def input_dim(self) -> int | None:
        """The input length when the configuration fixes it (``dim``, or ``features``, each
        categorical feature taking one column per category)."""
        if self.features is None:
            return self.dim
        return sum(len(self.categories.get(f, [f])) for f in self.features)


class ReachRuleConfig(ServingKeys):
    """Online reachability verification of one model on the inputs it currently sees."""

    kind: Literal["reach"]
    model: str = Field(description="the model whose decisions and updates are verified")
    features: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        description="with a serving stack's traffic: one [n, 1] input tensor per name, in order",
    )
    models_topic: str | None = Field(
        default=None, description="model updates ({model, version, onnx | uri}); none if unset"
    )
    onnx: Path | None = Field(default=None, description="the model to start with")
    window: Annotated[int, Field(ge=1)] = Field(
        default=1000, description="the input set is a box around the last `window` inputs"
    )
    eps: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        default=0.0, description="margin added around that box on every side"
    )
    C: list[list[float]] | None = Field(
        default=None, description="output spec C y <= d, one row per constraint"
    )
    d: list[float] | None = None
    spec: Path | None = Field(
        default=None,
        description="a VNN-LIB property over the outputs instead of C and d: its unsafe "
        "region a disjunction of single output constraints",
    )
    max_branches: Annotated[int, Field(ge=1)] = 250
    accelerations: str = "bmi+lb+bmw+inn+ic"
    inn_range: Annotated[float, Field(gt=0)] = 5.0
    rsr_gamma: Annotated[float, Field(gt=0)] = 1e-3
    timeout_seconds: Annotated[float, Field(gt=0)] = 60.0
    complete_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        default=0.0,
        description="a step the reach sets leave unknown goes on to the complete search "
        "for at most this long (0: off); it must fit in timeout_seconds",
    )

    @model_validator(mode="after")
    def _check(self) -> ReachRuleConfig:
        self._check_format()
        if self.complete_seconds >= self.timeout_seconds:
            raise ValueError(
                f"complete_seconds ({self.complete_seconds:g}) must be below timeout_seconds "
                f"({self.timeout_seconds:g}), the limit of the whole step"
            )
        if self.features is not None and self.format == "vigil":
            raise ValueError("features applies to format seldon or kserve for reach rules")
        Accelerations.parse(self.accelerations)
        if self.spec is not None:
            if self.C is not None or self.d is not None:
                raise ValueError("give spec or C and d, not both")
        elif self.C is None or self.d is None:
            raise ValueError("give the output spec: C and d, or spec (a VNN-LIB file)")
        else:
            c = np.array(self.C, dtype=float) if self.C else np.zeros((0, 0))
            if c.ndim != 2 or c.shape[0] != len(self.d) or c.shape[0] == 0:
                raise ValueError(f"C needs one non-empty row per entry of d ({len(self.d)})")
            if not (np.isfinite(c).all() and np.isfinite(self.d).all()):
                raise ValueError("C and d must be finite numbers")
        if self.onnx is None and self.models_topic is None:
            raise ValueError("set onnx (a starting model) or models_topic (updates), or both")
        return self


class CertifyRuleConfig(_Section):
    """Certification requests from a topic, each run as one job in the offload pool."""

    name: Annotated[str, Field(min_length=1)]
    kind: Literal["certify"]
    job: Literal["knn", "cfx", "batch"]
    topic: str = Field(description="the requests topic; its commits wait for the results")


class CfxRuleConfig(_Section):
    """Robustness of the counterfactual explanations that arrive with decisions (``cfx``)."""

    name: Annotated[str, Field(min_length=1)]
    kind: Literal["cfx"]
    topic: str
    model: str | None = Field(default=None, description="only this model's decisions")
    onnx: Path = Field(description="the model the counterfactuals explain")
    target: Annotated[int, Field(ge=0)] = 1
    gamma: Annotated[float, Field(gt=0, lt=1)] = 0.999
    R: Annotated[float, Field(gt=0, lt=1)] = 0.995
    min_delta: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="alert when a counterfactual's delta_max is below this"
    )


_RULE_CONFIGS = (IorRuleConfig, ReachRuleConfig, CertifyRuleConfig, CfxRuleConfig)
RuleConfig = Annotated[Union[_RULE_CONFIGS], Field(discriminator="kind")]  # noqa: UP007

RULE_KINDS = tuple(get_args(c.model_fields["kind"].annotation)[0] for c in _RULE_CONFIGS)
"""The ``kind`` tags of ``[[rules]]`` entries, as the union above declares them."""


class Config(_Section):
    kafka: KafkaConfig | None = None
    files: FilesConfig | None = None
    outputs: OutputsConfig = OutputsConfig()
    offload: OffloadConfig = OffloadConfig()
    metrics: MetricsConfig = MetricsConfig()
    state: StateConfig = StateConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    logging: LoggingConfig = LoggingConfig()
    seldon: SeldonConfig = SeldonConfig()
    rules: Annotated[list[RuleConfig], Field(min_length=1)]

    @model_validator(mode="after")
    def _check(self) -> Config:
        if (self.kafka is None) == (self.files is None):
            raise ValueError("configure exactly one source: a [kafka] or a [files] section")
        if self.files is not None and (
            self.outputs.alerts_file is None or self.outputs.dead_letter_file is None
        ):
            raise ValueError("[files] needs outputs.alerts_file and outputs.dead_letter_file")
        names = [r.name for r in self.rules]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"rule names must be unique: {', '.join(duplicated)}")
        held = {r.topic for r in self.rules if r.kind == "certify"}
        for r in self.rules:
            if r.kind != "certify" and held & {r.topic, getattr(r, "models_topic", None)}:
                raise ValueError(
                    f"rule {r.name!r} reads a certify rule's requests topic; requests need a "
                    "topic of their own (their commits wait for results)"
                )
        if self.offload.engine == "dask" and not {r.kind for r in self.rules} & {"certify", "cfx"}:
            raise ValueError(
                'offload.engine = "dask" runs certify and cfx jobs, and no such rule is '
                "configured; reach rules always run in a local process of their own (the "
                "verifier keeps its state there between steps)"
            )
        if self.files is not None:
            serving = [r.name for r in self.rules if getattr(r, "format", "vigil") != "vigil"]
            if serving:
                raise ValueError(f"rule {serving[0]!r}: formats seldon and kserve need [kafka]")
            self._check_files()
        serving = any(getattr(r, "format", "vigil") != "vigil" for r in self.rules)
        if serving and self.kafka is not None and not TOPIC_NAME.match(self.kafka.group_id):
            raise ValueError(
                f"group_id {self.kafka.group_id!r}: serving-stack rules name their topics "
                "after it, so only letters, digits, '.', '_' and '-'"
            )
        if self.state.store == "file" and self.state.topic is not None:
            raise ValueError('state.topic is only used with state.store = "kafka"')
        return self

    def _check_files(self) -> None:
        kinds = {r.kind for r in self.rules}
        needed = {
            "verifications_file": "reach" in kinds,
            "certifications_file": bool(kinds & {"certify", "cfx"}),
        }
        for key, used in needed.items():
            if used and getattr(self.outputs, key) is None:
                raise ValueError(f"[files] with these rules needs outputs.{key}")
        if self.state.store == "kafka":
            raise ValueError('state.store = "kafka" needs the [kafka] source, not [files]')
        for r in self.rules:
            if r.topic != self.files.topic or getattr(r, "models_topic", None):
                raise ValueError(
                    f"rule {r.name!r}: the [files] source has the one topic "
                    f"{self.files.topic!r}; models_topic and other topics need [kafka]"
                )


def parse_config(data: dict, origin: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = list(err["loc"])
            if loc[:1] == ["rules"] and len(loc) > 2 and loc[2] in RULE_KINDS:
                del loc[2]  # the union's tag: the user wrote rules[i].key, not rules[i].kind.key
            key = ".".join(str(p) for p in loc) or "(top level)"
            lines.append(f"  {key}: {err['msg']}")
        raise ConfigError(f"{origin}: invalid configuration\n" + "\n".join(lines)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML file; relative paths in it are relative to the file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (TOML is UTF-8)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    config = parse_config(data, str(path))
    config = _read_specs(_resolve_paths(config, path.parent), str(path))
    if config.files is not None:
        _check_decisions_file(config.files.decisions, str(path))
    if config.kafka is not None:
        _check_kafka_files(config.kafka, str(path))
    return config


def _read_specs(config: Config, origin: str) -> Config:
    """Each reach rule's ``spec`` file read into its C and d (paths already resolved)."""
    rules = []
    for i, rule in enumerate(config.rules):
        if isinstance(rule, ReachRuleConfig) and rule.spec is not None:
            try:
                c, d = safe_set(read_query(rule.spec, boxed=False))
            except SpecError as e:
                raise ConfigError(
                    f"{origin}: invalid configuration\n  rules.{i}.spec: {rule.spec}: {e}"
                ) from None
            rule = rule.model_copy(update={"C": c.tolist(), "d": d.tolist()})
        rules.append(rule)
    return config.model_copy(update={"rules": rules})


def _check_kafka_files(kafka: KafkaConfig, origin: str) -> None:
    """Certificates, keys and secret files exist and can be read (as the daemon's user)."""
    problems = []
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(kafka, key)
        if path is not None and not os.access(path, os.R_OK):
            problem = "cannot be read" if path.exists() else "no such file"
            problems.append(f"  kafka.{key}: {problem}: {path}")
    for key in ("sasl_password_file", "ssl_key_password_file"):
        if getattr(kafka, key) is not None:
            try:
                _read_secret(getattr(kafka, key), key)
            except ValueError as e:
                problems.append(f"  kafka.{e}")
    if not problems:
        try:
            kafka.security().ssl_context()
        except ValueError as e:
            problems.append(f"  kafka.{e}")
    if problems:
        raise ConfigError(f"{origin}: invalid configuration\n" + "\n".join(problems))


def _check_decisions_file(decisions: Path, origin: str) -> None:
    """The file source reads a decisions file that exists when the daemon starts (it does not
    wait for one to appear): a missing one is a configuration error, found before any
    output file is created."""
    if decisions.is_file():
        return
    problem = "is not a file" if decisions.exists() else "no such file"
    raise ConfigError(
        f"{origin}: invalid configuration\n  files.decisions: {problem}: {decisions} "
        "(a relative path is taken from the configuration file's directory)"
    )


def _resolve_paths(config: Config, base: Path) -> Config:
    def fix(p: Path | None) -> Path | None:
        return p if p is None or p.is_absolute() else base / p

    def fixed(section: BaseModel, keys: tuple[str, ...]) -> BaseModel:
        return section.model_copy(
            update={k: fix(getattr(section, k)) for k in keys if hasattr(section, k)}
        )

    updates: dict = {
        "state": fixed(config.state, ("dir",)),
        "outputs": fixed(
            config.outputs,
            ("alerts_file", "dead_letter_file", "verifications_file", "certifications_file"),
        ),
        "rules": [fixed(r, ("onnx", "embedding_onnx", "spec")) for r in config.rules],
    }
    if config.kafka is not None:
        updates["kafka"] = fixed(
            config.kafka,
            (
                "ssl_cafile",
                "ssl_certfile",
                "ssl_keyfile",
                "ssl_key_password_file",
                "sasl_password_file",
            ),
        )
    if config.files is not None:
        updates["files"] = fixed(config.files, ("decisions",))
    return config.model_copy(update=updates)
