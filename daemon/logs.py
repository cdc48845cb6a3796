"""structlog set-up: JSON lines in production, readable output on a terminal; stdlib
logging (aiokafka) rendered the same way."""

from __future__ import annotations

import logging
import sys

import structlog

LIBRARY_LOGGERS = ("aiokafka",)
"""Libraries whose stdlib logging is chatty at INFO (every rebalance, every coordinator
lookup): they log at WARNING and above unless the configured level is lower (debug)."""


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
