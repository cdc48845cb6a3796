"""structlog set-up: JSON lines in production, readable output on a terminal; stdlib
logging (aiokafka) rendered the same way, its repeats aggregated."""

from __future__ import annotations

import logging
import sys
import time

import structlog

LIBRARY_LOGGERS = ("aiokafka",)
"""Libraries whose stdlib logging is chatty at INFO (every rebalance, every coordinator
lookup): they log at WARNING and above unless the configured level is lower (debug)."""


EXPECTED_AT_START = {
    "GroupCoordinatorNotAvailable": logging.DEBUG,  # the group's coordinator is being elected
    "not found in cluster metadata": logging.INFO,  # a topic being auto-created
    "No partition metadata for topic": logging.INFO,  # the same, seen by the assignor
}
"""Fragments of client messages that name conditions a healthy start goes through, and the
level they are written at (the client says error or warning)."""

REPEAT_INTERVAL_SECONDS = 60.0


class ClientLogFilter(logging.Filter):
    """The Kafka client's records, made fit for a long-running log.

    Conditions a healthy start goes through are written at info or debug. While ``quiet``
    (the broker watch has found the cluster away, daemon/broker.py) warnings and errors are
    counted, not written: they all tell the outage the watch reports once. Otherwise each
    message kind (its format string) is written at most once per ``interval`` seconds; the
    first one after that says how many were held back. A record with a traceback is always
    written."""

    def __init__(self, interval: float = REPEAT_INTERVAL_SECONDS) -> None:
        super().__init__()
        self.interval = interval
        self.threshold = logging.INFO
        self.quiet = False
        self._suppressed = 0
        self._kinds: dict[tuple[str, str], tuple[float, int]] = {}  # last written, held

    def reset(self) -> None:
        """Forget what was held back and written (a process that configures its logging
        again starts afresh)."""
        self.quiet = False
        self._suppressed = 0
        self._kinds.clear()

    def take_suppressed(self) -> int:
        """Records held back while quiet since the last call."""
        n, self._suppressed = self._suppressed, 0
        return n

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(LIBRARY_LOGGERS) or record.exc_info:
            return True  # a traceback is never held back
        try:
            text = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit: the handler reports it
            return True
        for fragment, level in EXPECTED_AT_START.items():
            if fragment in text and record.levelno > level:
                record.levelno, record.levelname = level, logging.getLevelName(level)
        if record.levelno < self.threshold:
            return False
        if self.quiet and record.levelno >= logging.WARNING:
            self._suppressed += 1
            return False
        kind = (record.name, str(record.msg))
        now = time.monotonic()
        last, held = self._kinds.get(kind, (-self.interval, 0))
        if now - last < self.interval:
            self._kinds[kind] = (last, held + 1)
            return False
        self._kinds[kind] = (now, 0)
        if held:
            record.msg = f"{text} ({held} more like it in the last {now - last:.0f} s)"
            record.args = None
        return True


CLIENT_LOGS = ClientLogFilter()
"""The one filter of the process's client records (the broker watch sets ``quiet``)."""


class _VigilHandler(logging.StreamHandler):
    """The stderr handler that configure_logging puts on the root logger (and replaces when
    called again)."""


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """structlog events and stdlib ``logging`` records (aiokafka's, Python warnings) both
    go to stderr through the same renderer: one JSON object per line, or console lines."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    threshold = logging.getLevelNamesMapping()[level.upper()]
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = _VigilHandler(sys.stderr)
    CLIENT_LOGS.reset()
    CLIENT_LOGS.threshold = threshold
    handler.addFilter(CLIENT_LOGS)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _VigilHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(threshold)
    library = threshold if threshold < logging.INFO else max(threshold, logging.WARNING)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(library)
    logging.captureWarnings(True)  # warnings.warn(...) as records of the "py.warnings" logger
