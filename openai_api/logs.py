"""Log lines a client cannot forge: no control character it sent ever reaches a log line as itself.

Client text reaches the logs in many places (an adapter's `lora_name` in the LoRA service's lines, model
names and Triton's words in backend warnings, field names in debug lines, exception messages in
tracebacks), through the gateway's loggers, uvicorn's and the libraries'. Escaping at each call would
miss the next one, so it happens once, where every record is made: `install()` sets the logging module's
record factory to `SafeLogRecord`, whose message (`getMessage`, what every formatter prints) has each
control character escaped (`escape_controls`: newline as `\\n`, carriage return `\\r`, tab `\\t`, any other
C0 or C1 control, DEL and the Unicode line and paragraph separators as `\\xNN` / `\\uNNNN`). A record carrying
an exception has its traceback rendered with the same escaping of every exception message and note in
the chain; the traceback's own lines (frames, "During handling of ...") stay lines. So one record is one
line, plus the lines of its traceback, whatever the client sent.

`--log-format json` (`JSONFormatter`) writes each record as one JSON object on one line instead (JSON escapes
every control character itself, the traceback included): `time` (UTC, ISO 8601), `level`, `logger`, `message`,
`process` (with workers), `exception` (a traceback, as text), and, for a record made while a request is served,
its `request_id` and, with tracing on, the `trace_id` and `span_id` of its current span. The access log's records
carry their fields (`AccessLine`) as fields of their own: `method`, `path`, `status`, `duration_ms`,
`request_id`, `key` (the keys file's name: never the key), `model`, `ttft_ms`, `prompt_tokens`,
`completion_tokens`, `object_id`, `client_disconnected`, `trace_id`, `span_id`.
"""

from __future__ import annotations

import logging
import re
import time
import traceback
from collections.abc import Mapping
from typing import Any

import orjson
from opentelemetry import trace

from openai_api.observability import current_stats

# C0 controls, DEL, C1 controls, and the characters Unicode (and some log viewers) treat as line breaks.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape_controls(text: str) -> str:
    """`text` with every control character escaped (see the module docstring); unchanged, and not copied,
    when it has none (the common case: one regex scan)."""
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


def _escape_exception(te: traceback.TracebackException, seen: set[int]) -> None:
    """Escape the message and notes of every exception in `te`'s chain (causes, contexts, groups), in place."""
    if id(te) in seen:
        return
    seen.add(id(te))
    if isinstance(getattr(te, "_str", None), str):  # the message as the traceback prints it
        te._str = escape_controls(te._str)  # type: ignore[attr-defined]
    notes = getattr(te, "__notes__", None)
    if isinstance(notes, list):
        te.__notes__ = [escape_controls(n) if isinstance(n, str) else n for n in notes]
    for nxt in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())):
        if nxt is not None:
            _escape_exception(nxt, seen)


def format_exception(exc_info: Any) -> str:
    """A traceback as `logging.Formatter.formatException` writes it, every exception message escaped."""
    te = traceback.TracebackException(*exc_info, compact=True)
    _escape_exception(te, set())
    return "".join(te.format()).rstrip("\n")


class SafeLogRecord(logging.LogRecord):
    """A log record whose message and traceback hold no control character (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.exc_info and self.exc_info[0] is not None:
            # Formatters print `exc_text` when it is set, and only format `exc_info` themselves when not.
            self.exc_text = format_exception(self.exc_info)

    def getMessage(self) -> str:
        return escape_controls(super().getMessage())


def install() -> None:
    """Make every log record of this process safe (idempotent): logging's own record class becomes
    `SafeLogRecord`; a factory someone else set (instrumentation) is kept, its records' message escaped
    once as it is made."""
    current = logging.getLogRecordFactory()
    if current is SafeLogRecord or getattr(current, "escapes_controls", False):
        return
    if current is logging.LogRecord:
        logging.setLogRecordFactory(SafeLogRecord)
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = current(*args, **kwargs)
        record.msg, record.args = escape_controls(record.getMessage()), None
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = format_exception(record.exc_info)
        return record

    factory.escapes_controls = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


_SAFE_VALUE = re.compile(r"^[\w./:@+\-]*$")


def _kv(value: Any) -> str:
    s = str(value)
    return s if s and _SAFE_VALUE.match(s) else orjson.dumps(s).decode()


class AccessLine:
    """One access-log record's fields. As a text message (`str`, formatted only when a text handler prints it):
    `method=POST path=/v1/chat/completions status=200 duration_ms=412.7 request_id=... model=...`, a value
    quoted as JSON when it is not a plain word. `JSONFormatter` writes the fields themselves."""

    __slots__ = ("fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" if isinstance(v, int | float) and not isinstance(v, bool) else
                        f"{k}={'true' if v is True else 'false' if v is False else _kv(v)}"
                        for k, v in self.fields.items())


def _utc(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


class JSONFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def __init__(self, with_pid: bool = False) -> None:
        super().__init__()
        self.with_pid = with_pid

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"time": _utc(record.created), "level": record.levelname, "logger": record.name}
        if self.with_pid:
            out["process"] = record.process
        msg = record.msg
        if isinstance(msg, AccessLine):
            fields = msg.fields
            out["message"] = f"{fields.get('method', '')} {fields.get('path', '')} {fields.get('status', '')}"
            out.update(fields)
        else:
            out["message"] = record.getMessage()
            stats = current_stats()
            if stats is not None:
                out["request_id"] = stats.request_id
            ctx = trace.get_current_span().get_span_context()
            if ctx.is_valid:
                out["trace_id"], out["span_id"] = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
        if record.exc_info and not record.exc_text:
            record.exc_text = format_exception(record.exc_info)
        if record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return orjson.dumps(out, default=str).decode()
