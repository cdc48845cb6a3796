"""The daemon's TOML configuration, validated with pydantic; every error names its key."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rules.ior.backends import parse_backend


class ConfigError(ValueError):
    """A configuration that cannot be used; the message lists each bad key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaConfig(_Section):
    bootstrap_servers: str
    group_id: str = "vigil"
    exactly_once: bool = False
    transactional_id: str | None = Field(
        default=None, description="fixed per instance so a restart fences its predecessor"
    )
    client_id: str = "vigil"
    max_batch: Annotated[int, Field(ge=1)] = 2000
    fetch_timeout_ms: Annotated[int, Field(ge=1)] = 200
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    session_timeout_ms: Annotated[int, Field(ge=1000)] = Field(
        default=10_000, description="how soon a crashed instance's partitions are reassigned"
    )


class FilesConfig(_Section):
    """JSON-lines files instead of Kafka: the embedded default (no broker)."""

    decisions: Path
    topic: str = Field(default="decisions", description="the topic name rules refer to")
    max_batch: Annotated[int, Field(ge=1)] = 4096


class OutputsConfig(_Section):
    alerts_topic: str = "vigil.alerts"
    dead_letter_topic: str = "vigil.dead-letters"
    alerts_file: Path | None = None
    dead_letter_file: Path | None = None


class MetricsConfig(_Section):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 9464
    enabled: bool = True


class StateConfig(_Section):
    dir: Path = Path("vigil-state")
    snapshot_every_events: Annotated[int, Field(ge=1)] = 100_000
    snapshot_every_seconds: Annotated[float, Field(gt=0)] = 60.0
    keep: Annotated[int, Field(ge=1)] = 3


class ShutdownConfig(_Section):
    deadline_seconds: Annotated[float, Field(gt=0)] = 30.0


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class IorRuleConfig(_Section):
    name: Annotated[str, Field(min_length=1)]
    kind: Literal["ior"]
    topic: str
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

    @model_validator(mode="after")
    def _check(self) -> IorRuleConfig:
        parse_backend(self.backend)
        if self.output == "label" and self.delta:
            raise ValueError("delta applies to probability outputs only")
        if self.dim is not None:
            if any(i >= self.dim for i in self.ignore):
                raise ValueError(f"ignore has an index >= dim ({self.dim})")
            if self.scale is not None and len(self.scale) != self.dim:
                raise ValueError(f"scale has {len(self.scale)} entries, dim is {self.dim}")
        return self


class Config(_Section):
    kafka: KafkaConfig | None = None
    files: FilesConfig | None = None
    outputs: OutputsConfig = OutputsConfig()
    metrics: MetricsConfig = MetricsConfig()
    state: StateConfig = StateConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    logging: LoggingConfig = LoggingConfig()
    rules: Annotated[list[IorRuleConfig], Field(min_length=1)]

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
        return self


def parse_config(data: dict, origin: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {key}: {err['msg']}")
        raise ConfigError(f"{origin}: invalid configuration\n" + "\n".join(lines)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML file; relative paths in it are relative to the file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    config = parse_config(data, str(path))
    return _resolve_paths(config, path.parent)


def _resolve_paths(config: Config, base: Path) -> Config:
    def fix(p: Path | None) -> Path | None:
        return p if p is None or p.is_absolute() else base / p

    updates: dict = {"state": config.state.model_copy(update={"dir": fix(config.state.dir)})}
    updates["outputs"] = config.outputs.model_copy(
        update={
            "alerts_file": fix(config.outputs.alerts_file),
            "dead_letter_file": fix(config.outputs.dead_letter_file),
        }
    )
    if config.files is not None:
        updates["files"] = config.files.model_copy(
            update={"decisions": fix(config.files.decisions)}
        )
    return config.model_copy(update=updates)
