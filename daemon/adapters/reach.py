"""The ``reach`` rule: re-verify a model on the inputs it currently sees, as they drift and as
the model is updated, and emit one verification event per step."""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np
import orjson
import structlog

from vigil.connectors.base import OutMessage, TopicPartition
from vigil.connectors.events import Decision, Record, encode, now_iso
from vigil.daemon.adapters.base import (
    Answer,
    Rule,
    RuleContext,
    RuleResult,
    StaleSnapshot,
    StatePart,
    read_model,
)
from vigil.daemon.config import ReachRuleConfig
from vigil.daemon.offload import JobOutcome, OffloadPool
from vigil.rules.reach import worker
from vigil.rules.reach.network import Network

log = structlog.get_logger("vigil.reach")
LOAD_JOB, STEP_JOB = "reach.load", "reach.step"
"""The offload job kinds of the rule's lane: checking a new model, one verification step."""


class ModelUpdateError(ValueError):
    """A model update event that cannot be used; ``reason`` labels the dead letter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ReachRule(Rule):
    """The verifier state lives in a worker process of the rule's own one-process pool (so
    the event loop never computes a step); decisions and model updates arrive on their topics.
    Each assigned partition of the decisions topic keeps a window of its last ``window``
    inputs (snapshotted, restored and dropped with its partition); the input set is the box
    around every window's inputs, widened by ``eps``.

    The current model fixes the input width: decisions of another width are dead letters,
    and a model of another width than the windows' inputs empties them (those inputs are not
    in its input space)."""

    kind = "reach"
    stateful = True
    backend = "reach"

    def __init__(self, config: ReachRuleConfig, context: RuleContext) -> None:
        if config.C is None or config.d is None:
            raise ValueError(f"rule {config.name!r}: its spec file was not read (load_config)")
        topics = {config.topic} | ({config.models_topic} if config.models_topic else set())
        super().__init__(config.name, topics)
        self.config = config
        self.context = context
        self.pool: OffloadPool = context.make_pool(config.name, 1, config.timeout_seconds)
        self.options = {
            "C": config.C,
            "d": config.d,
            "max_branches": config.max_branches,
            "accelerations": config.accelerations,
            "inn_range": config.inn_range,
            "rsr_gamma": config.rsr_gamma,
            "complete_seconds": config.complete_seconds,
        }
        self.windows: dict[TopicPartition, np.ndarray] = {}  # last inputs, oldest first
        self.model: bytes | None = None
        self.version: str | None = None
        self.input_dim: int | None = None  # the current model's
        self._sent: str | None = None  # the version the worker was last sent
        if config.onnx is not None:
            self.model, network = read_model(config.onnx, config.name)
            if network.output_dim != len(config.C[0]):
                raise ValueError(
                    f"rule {config.name!r}: onnx {config.onnx} has {network.output_dim} "
                    f"outputs, the spec C has {len(config.C[0])} columns"
                )
            self.version = f"file:{Path(config.onnx).name}"
            self.input_dim = network.input_dim

    def wants_decisions(self, topic: str) -> bool:
        return topic == self.config.topic

    def serves(self, model: str) -> bool:
        return model == self.config.model

    def history_size(self, tp: TopicPartition) -> int:
        return len(self.windows.get(tp, ()))

    async def check(
        self, tp: TopicPartition, decisions: Sequence[Decision], emit_from: int
    ) -> RuleResult:
        started = time.perf_counter()
        result = RuleResult()
        self._fit_windows()
        dim = self._input_width()
        x = _well_formed(decisions, dim)
        if x is None:  # some input is malformed: find which, one by one
            rows = []
            for d in decisions:
                problem = _input_problem(d.x, dim)
                if problem:
                    result.dead.append((d.record, *problem))
                    continue
                dim = dim or len(d.x)
                rows.append(d.x)
            if not rows:
                return result
            x = np.array(rows, dtype=np.float64)
        window = self.windows.get(tp)
        stack = x if window is None else np.vstack([window, x])
        self.windows[tp] = stack[-self.config.window :]
        result.checked = len(x)
        # the step's verification is timed as a lane job (vigil_offload_job_seconds)
        result.seconds = time.perf_counter() - started
        if decisions[-1].record.offset >= emit_from and self.model is not None:
            trigger = decisions[-1].record
            result.events.append(Answer.to(trigger, await self._step(trigger)))
        return result

    async def handle(self, tp: TopicPartition, records: list[Record], emit_from: int) -> RuleResult:
        """Model updates: accepted ones replace the model and trigger a step."""
        result = RuleResult()
        for record in records:
            try:
                update = _decode_update(record, self.config.model)
                if update is None:
                    continue  # another model's update
                version, onnx = update
                outcome = await self._check_model(onnx)
                if outcome.status == "invalid":
                    raise ModelUpdateError("model", f"model {version!r} rejected: {outcome.error}")
                if outcome.status != "ok":
                    raise ModelUpdateError(
                        "model",
                        f"model {version!r} could not be checked ({outcome.error}), twice; "
                        "the rule keeps the previous model (raise timeout_seconds if the "
                        "model is large, and publish the update again)",
                    )
            except ModelUpdateError as e:
                result.dead.append((record, e.reason, str(e)))
                continue
            self.model, self.version = onnx, version
            self.input_dim = outcome.value["input_dim"]
            self._fit_windows()
            result.checked += 1
            if record.offset >= emit_from and self.windows:
                result.events.append(Answer.to(record, await self._step(record)))
        return result

    async def _check_model(self, onnx: bytes) -> JobOutcome:
        """Load and check a model in the lane; a timeout or a dead worker (the lane is
        replaced) is tried once more before the update is given up."""
        check = partial(self.pool.submit, LOAD_JOB, worker.check_model, onnx, len(self.config.C[0]))
        outcome = await check()
        if outcome.status in ("timeout", "error"):
            outcome = await check()
        return outcome

    def _input_width(self) -> int | None:
        """The width decisions must have: the model's, else the windows', else any."""
        if self.input_dim is not None:
            return self.input_dim
        return next((w.shape[1] for w in self.windows.values()), None)

    def _fit_windows(self) -> None:
        """Empty the windows whose inputs the current model cannot take."""
        for tp, window in list(self.windows.items()):
            if self.input_dim in (None, window.shape[1]):
                continue
            log.warning(
                "reach_window_reset",
                rule=self.name,
                tp=tp,
                window_width=window.shape[1],
                model_width=self.input_dim,
                version=self.version,
            )
            del self.windows[tp]

    async def _step(self, trigger: Record) -> OutMessage:
        windows = list(self.windows.values())
        lower = np.min([w.min(axis=0) for w in windows], axis=0) - self.config.eps
        upper = np.max([w.max(axis=0) for w in windows], axis=0) + self.config.eps
        outcome = await self._submit(lower, upper, resend=self._sent != self.version)
        if outcome.status == "ok" and outcome.value.get("need_model"):
            outcome = await self._submit(lower, upper, resend=True)
        event = {
            "kind": "verification",
            "rule": self.name,
            "model": self.config.model,
            "version": self.version,
            "decisions": sum(len(w) for w in windows),
            "input_set": {"lower": lower.tolist(), "upper": upper.tolist()},
            "source": trigger.source,
            "verified_at": now_iso(),
        }
        if outcome.status == "ok":
            event.update(outcome.value)
            self.context.metrics.verification_coverage.labels(self.name).set(event["coverage"])
        else:
            self._sent = None  # the worker may have died with its state
            event.update(status="error", error=outcome.error, seconds=outcome.seconds)
        self.context.metrics.verifications.labels(self.name, event["status"]).inc()
        key = self.config.model.encode()
        return OutMessage(self.context.verifications_topic, key, encode(event))

    async def _submit(self, lower: np.ndarray, upper: np.ndarray, resend: bool) -> JobOutcome:
        onnx = self.model if resend else None
        outcome = await self.pool.submit(
            STEP_JOB, worker.step, self.name, self.options, self.version, onnx, lower, upper
        )
        if resend and outcome.status == "ok":
            self._sent = self.version
        return outcome

    def offload_jobs(self) -> dict[str, set[str]]:
        return {self.pool.name: {LOAD_JOB, STEP_JOB}}

    def snapshot(self, tp: TopicPartition, since: int | None = None) -> StatePart | None:
        """A base always: a window and a model are small."""
        buffer = io.BytesIO()
        if tp[0] == self.config.topic and tp in self.windows:
            np.savez(buffer, window=self.windows[tp])
        elif tp[0] == self.config.models_topic and self.model is not None:
            version = np.frombuffer(self.version.encode(), dtype=np.uint8)
            np.savez(buffer, model=np.frombuffer(self.model, dtype=np.uint8), version=version)
        else:
            return None
        return StatePart(buffer.getvalue())

    def restore(self, tp: TopicPartition, parts: list[bytes]) -> None:
        """Continue from a snapshot. A window of another width than the current model's is
        refused with ``StaleSnapshot`` (the partition is replayed instead); a restored model
        of another width empties the window."""
        (blob,) = parts  # a base, never segments
        with np.load(io.BytesIO(blob)) as data:
            if "window" in data:
                window = data["window"]
                if self.input_dim not in (None, window.shape[1]):
                    raise StaleSnapshot(
                        f"the snapshot's inputs have {window.shape[1]} values, "
                        f"the model takes {self.input_dim}"
                    )
                self.windows[tp] = window[-self.config.window :]
            else:
                self.model = data["model"].tobytes()
                self.version = data["version"].tobytes().decode()
                self.input_dim = Network.from_onnx(self.model).input_dim
                self._fit_windows()

    def drop(self, tp: TopicPartition) -> None:
        self.windows.pop(tp, None)

    def close(self) -> None:
        self.pool.shutdown()


def _well_formed(decisions: Sequence[Decision], dim: int | None) -> np.ndarray | None:
    """The batch's inputs as one array when all are finite numbers of one length (the usual
    case), else None."""
    try:
        x = np.array([d.x for d in decisions])
    except ValueError:  # ragged
        return None
    if x.dtype.kind not in "if" or x.ndim != 2 or x.shape[1] == 0:
        return None
    if (dim is not None and x.shape[1] != dim) or not np.all(np.isfinite(x)):
        return None
    return x.astype(np.float64)


def _input_problem(x: list | np.ndarray, dim: int | None) -> tuple[str, str] | None:
    if isinstance(x, np.ndarray):  # a row of a decisions batch
        x = x.tolist()
    if not x or not all(isinstance(v, int | float) for v in x):
        return "schema", "x must be a non-empty array of numbers"
    if dim is not None and len(x) != dim:
        return "dimension", f"x has {len(x)} values, the rule expects {dim}"
    if not np.all(np.isfinite(x)):
        return "non_finite", "x has a NaN or infinity"
    return None


def _decode_update(record: Record, model: str) -> tuple[str, bytes] | None:
    """(version, ONNX bytes) of an update of ``model`` (None for another model's update);
    see connectors/schemas/model_update.json."""
    try:
        event = orjson.loads(record.value or b"")
    except orjson.JSONDecodeError as e:
        raise ModelUpdateError("undecodable", f"not valid JSON: {e}") from None
    if not isinstance(event, dict):
        raise ModelUpdateError("schema", "a model update must be a JSON object")
    name, version = event.get("model"), event.get("version")
    if not isinstance(name, str) or not isinstance(version, str | int):
        raise ModelUpdateError("schema", "a model update needs a string model and a version")
    if name != model:
        return None
    if ("onnx" in event) == ("uri" in event):
        raise ModelUpdateError("schema", "a model update carries exactly one of onnx and uri")
    if "onnx" in event:
        try:
            return str(version), base64.b64decode(event["onnx"], validate=True)
        except (TypeError, ValueError) as e:
            raise ModelUpdateError("schema", f"onnx is not base64: {e}") from None
    uri = urlparse(str(event["uri"]))
    if uri.scheme != "file":
        raise ModelUpdateError(
            "schema", f"only file:// model URIs are supported, got {uri.scheme!r}"
        )
    try:
        return str(version), Path(url2pathname(uri.path)).read_bytes()
    except OSError as e:
        raise ModelUpdateError("model", f"cannot read {event['uri']}: {e}") from None
