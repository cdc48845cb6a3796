"""Logging set-up: structlog events and stdlib records (aiokafka's) share one renderer, so in
JSON mode every stderr line is one JSON object."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import structlog

from vigil.daemon.logs import LIBRARY_LOGGERS, configure_logging


@pytest.fixture
def restore_logging():
    """configure_logging changes process-wide state: put it back after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    library_levels = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
    for name, lib_level in library_levels.items():
        logging.getLogger(name).setLevel(lib_level)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def _json_lines(text: str) -> list[dict]:
    lines = text.splitlines()
    assert lines, "nothing on stderr"
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a stderr line is not JSON: {line!r}\nstderr:\n{text}")
    return parsed


def test_json_mode_renders_stdlib_records_as_json(capfd, restore_logging):
    configure_logging("info", "json")
    kafka = logging.getLogger("aiokafka.consumer.group_coordinator")
    kafka.warning("Heartbeat failed for group %s because it is rebalancing", "vigil")
    kafka.info("Discovered coordinator 1 for group vigil")  # below aiokafka's WARNING
    logging.getLogger("vigil.test").info("a stdlib record at the configured level")
    structlog.get_logger().info("started", rules=2)
    structlog.get_logger().debug("not shown at info")
    out, err = capfd.readouterr()
    assert out == ""
    lines = _json_lines(err)
    assert [(e["event"], e["level"]) for e in lines] == [
        ("Heartbeat failed for group vigil because it is rebalancing", "warning"),
        ("a stdlib record at the configured level", "info"),
        ("started", "info"),
    ]
    assert lines[0]["logger"] == "aiokafka.consumer.group_coordinator"
    assert lines[1]["logger"] == "vigil.test"
    assert lines[2]["rules"] == 2
    assert all("timestamp" in e for e in lines)


def test_json_mode_puts_a_traceback_inside_the_record(capfd, restore_logging):
    configure_logging("info", "json")
    try:
        raise RuntimeError("connection reset")
    except RuntimeError:
        logging.getLogger("aiokafka").exception("Unexpected error in fetcher routine")
    (entry,) = _json_lines(capfd.readouterr().err)
    assert entry["event"] == "Unexpected error in fetcher routine"
    assert entry["level"] == "error" and entry["logger"] == "aiokafka"
    assert "RuntimeError: connection reset" in entry["exception"]


def test_debug_level_lets_library_debug_records_through(capfd, restore_logging):
    configure_logging("debug", "json")
    logging.getLogger("aiokafka").debug("Sending metadata request")
    structlog.get_logger().debug("fetched", records=3)
    lines = _json_lines(capfd.readouterr().err)
    assert [(e["event"], e["level"]) for e in lines] == [
        ("Sending metadata request", "debug"),
        ("fetched", "debug"),
    ]


def test_configuring_again_keeps_one_handler(capfd, restore_logging):
    configure_logging("info", "json")
    configure_logging("warning", "json")
    logging.getLogger("aiokafka").warning("once")
    logging.getLogger("aiokafka").info("filtered at warning")
    assert [e["event"] for e in _json_lines(capfd.readouterr().err)] == ["once"]


def test_console_mode_renders_both_kinds(capfd, restore_logging):
    configure_logging("info", "console")
    logging.getLogger("aiokafka").warning("Heartbeat failed for group %s", "vigil")
    structlog.get_logger().info("started", rules=2)
    out, err = capfd.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2
    assert "Heartbeat failed for group vigil" in lines[0] and "aiokafka" in lines[0]
    assert "started" in lines[1] and "rules" in lines[1]


def test_python_warnings_become_json_records():
    """In a fresh process (pytest manages warnings of its own): warnings.warn goes through
    the "py.warnings" logger, so it is a JSON line too."""
    script = (
        "import logging, warnings, structlog\n"
        "from vigil.daemon.logs import configure_logging\n"
        "configure_logging('info', 'json')\n"
        "warnings.warn('a deprecated option', DeprecationWarning, stacklevel=1)\n"
        "warnings.warn('something odd', UserWarning, stacklevel=1)\n"
        "logging.getLogger('aiokafka').warning('Topic %s not found', 'decisions')\n"
        "structlog.get_logger().info('stopped')\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "always", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = _json_lines(result.stderr)
    assert [e["logger"] for e in lines[:3]] == ["py.warnings", "py.warnings", "aiokafka"]
    assert "a deprecated option" in lines[0]["event"]
    assert lines[2]["event"] == "Topic decisions not found"
    assert lines[3]["event"] == "stopped"


def _record(name: str, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_client_repeats_are_written_once_per_interval_with_the_count_held_back(monkeypatch):
    from vigil.daemon import logs

    now = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    f = logs.ClientLogFilter(interval=60)
    first = _record("aiokafka", logging.ERROR, "Unable connect to node with id %s", 1)
    assert f.filter(first)
    held = [
        f.filter(_record("aiokafka", logging.ERROR, "Unable connect to node with id %s", n))
        for n in range(5)
    ]
    assert held == [False] * 5
    other = _record("aiokafka", logging.ERROR, "Unable to update metadata from %s", [1])
    assert f.filter(other), "another kind is not held back by the first"
    assert f.filter(_record("vigil", logging.ERROR, "x")), "only the client's records are held"
    now[0] += 61
    again = _record("aiokafka", logging.ERROR, "Unable connect to node with id %s", 2)
    assert f.filter(again)
    assert (
        again.getMessage() == "Unable connect to node with id 2 (5 more like it in the last 61 s)"
    )


def test_client_errors_are_counted_not_written_while_the_broker_is_away():
    from vigil.daemon.logs import ClientLogFilter

    f = ClientLogFilter()
    f.quiet = True
    assert not any(
        f.filter(_record("aiokafka.consumer.fetcher", logging.ERROR, "Failed fetch %d", i))
        for i in range(7)
    )
    assert f.take_suppressed() == 7 and f.take_suppressed() == 0
    f.quiet = False
    assert f.filter(_record("aiokafka.consumer.fetcher", logging.ERROR, "Failed fetch %d", 8))


@pytest.mark.parametrize(
    ("msg", "level"),
    [
        ("Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError", "DEBUG"),
        ("Topic vigil.alerts not found in cluster metadata", "INFO"),
    ],
)
def test_a_healthy_start_up_is_not_an_error(msg, level):
    from vigil.daemon.logs import ClientLogFilter

    f = ClientLogFilter()
    record = _record("aiokafka.cluster", logging.ERROR, msg)
    assert f.filter(record) is (level == "INFO")  # debug is below the info threshold
    assert record.levelname == level


def test_a_client_traceback_is_never_held_back():
    import sys as _sys

    from vigil.daemon.logs import ClientLogFilter

    f = ClientLogFilter()
    f.quiet = True
    try:
        raise RuntimeError("listener failed")
    except RuntimeError:
        info = _sys.exc_info()
    record = logging.LogRecord(
        "aiokafka.consumer", logging.ERROR, "", 1, "failed: %s", ("x",), info
    )
    assert f.filter(record) and f.filter(record)  # not quiet-counted, not rate-limited
    assert f.take_suppressed() == 0
