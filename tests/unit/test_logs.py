"""Log lines a client cannot forge (`openai_api.logs`): once installed, every record's message and the
messages in its traceback hold no control character, through any formatter, for any logger."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from openai_api import logs
from openai_api.logs import SafeLogRecord, escape_controls

FORGED = "x\n2026-01-01 00:00:00,000 INFO openai_api.access: method=GET path=/admin status=200"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(logging.LogRecord)
    logs.install()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("tests.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        logging.setLogRecordFactory(factory)


def test_every_control_character_is_escaped_and_plain_text_is_untouched() -> None:
    assert escape_controls("plain text, é and 日本") == "plain text, é and 日本"
    assert escape_controls("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert escape_controls("\x00\x1b[31m\x7f\x85\u2028\u2029") == "\\x00\\x1b[31m\\x7f\\x85\\u2028\\u2029"


def test_a_client_newline_never_starts_a_line(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.info("LoRA adapter %s loaded", FORGED)
    logger.warning(FORGED)  # in the format string itself
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and not any(line.startswith("2026") for line in lines)
    assert lines[0] == "INFO tests.logs: LoRA adapter " + FORGED.replace("\n", "\\n") + " loaded"


def test_tracebacks_keep_their_lines_but_not_the_exception_messages_newlines(
        captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    try:
        try:
            raise KeyError(FORGED)
        except KeyError as e:
            e.add_note("note " + FORGED)
            raise ValueError(FORGED) from e
    except ValueError:
        logger.exception("unhandled error")
    text = out.getvalue()
    assert "Traceback (most recent call last):" in text and "The above exception was the direct cause" in text
    assert not any(line.startswith("2026") for line in text.splitlines()), text
    assert "ValueError: " + FORGED.replace("\n", "\\n") in text


def test_a_factory_set_by_someone_else_is_kept_and_its_records_escaped() -> None:
    factory = logging.getLogRecordFactory()
    made: list[logging.LogRecord] = []

    def theirs(*args: object, **kwargs: object) -> logging.LogRecord:
        record = logging.LogRecord(*args, **kwargs)  # type: ignore[arg-type]
        made.append(record)
        return record

    logging.setLogRecordFactory(theirs)
    try:
        logs.install()
        logs.install()  # idempotent
        record = logging.getLogRecordFactory()("n", logging.INFO, __file__, 1, "%s", (FORGED,), None)
        assert made == [record] and "\n" not in record.getMessage()
    finally:
        logging.setLogRecordFactory(factory)
    assert isinstance(logging.LogRecord("n", logging.INFO, __file__, 1, "m", None, None), logging.LogRecord)
    assert issubclass(SafeLogRecord, logging.LogRecord)


def _ours(logger: logging.Logger, out: io.StringIO) -> logging.Handler:
    return next(h for h in logger.handlers if getattr(h, "stream", None) is out)


@pytest.fixture
def json_captured(captured: tuple[logging.Logger, io.StringIO]) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    logger, out = captured
    _ours(logger, out).setFormatter(logs.JSONFormatter())
    yield logger, out


def test_json_lines_one_object_per_record_with_the_request_and_its_trace(
        json_captured: tuple[logging.Logger, io.StringIO]) -> None:
    import json

    from opentelemetry.sdk.trace import TracerProvider

    from openai_api.observability import RequestStats, bind_stats, unbind_stats

    logger, out = json_captured
    logger.warning("before %s", FORGED)
    token = bind_stats(RequestStats(0.0, "rid-7"))
    tracer = TracerProvider().get_tracer("tests")
    with tracer.start_as_current_span("request") as span:
        logger.info("inside")
        ids = span.get_span_context()
    unbind_stats(token)
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # one line per record, the traceback's lines included
    first, inside, failed = (json.loads(line) for line in lines)
    assert first["level"] == "WARNING" and first["logger"] == "tests.logs" and "request_id" not in first
    assert first["message"].startswith("before x\\n2026") and first["time"].endswith("Z")
    assert inside["request_id"] == "rid-7"
    assert (inside["trace_id"], inside["span_id"]) == (f"{ids.trace_id:032x}", f"{ids.span_id:016x}")
    assert "Traceback" in failed["exception"] and "ValueError: bad\\nvalue" in failed["exception"]


def test_an_access_record_is_a_line_of_text_or_json_fields(captured: tuple[logging.Logger, io.StringIO]) -> None:
    import json

    logger, out = captured
    fields = {"method": "POST", "path": "/v1/chat/completions", "status": 200, "duration_ms": 12.5,
              "request_id": "rid\n1", "model": "m", "client_disconnected": True, "key": "team-a"}
    logger.info(logs.AccessLine(fields))
    assert out.getvalue().splitlines() == [
        'INFO tests.logs: method=POST path=/v1/chat/completions status=200 duration_ms=12.5 request_id="rid\\n1" '
        'model=m client_disconnected=true key=team-a']
    _ours(logger, out).setFormatter(logs.JSONFormatter(with_pid=True))
    logger.info(logs.AccessLine(fields))
    record = json.loads(out.getvalue().splitlines()[-1])
    assert {k: record[k] for k in fields} == fields
    assert record["message"] == "POST /v1/chat/completions 200" and isinstance(record["process"], int)


async def test_the_access_log_in_json_names_the_key_the_model_its_timings_and_its_trace(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the app (keys file, tracing on, the unit tier's fake backend): the access record's JSON has the
    key's name (never the key), the model, status, timings and the ids of the request's server span."""
    import hashlib
    import json

    import httpx
    from opentelemetry.exporter.otlp.proto.http import trace_exporter
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from openai_api.app import create_app
    from openai_api.settings import Settings
    from tests.unit.fakes import MODEL, FakeBackend, llm_only_config

    # tracing on, its spans kept in memory (nothing is sent anywhere)
    monkeypatch.setattr(trace_exporter, "OTLPSpanExporter", lambda **_: InMemorySpanExporter())
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "secret_sha256": hashlib.sha256(b"sk-a").hexdigest()}]}))
    app = create_app(llm_only_config(tmp_path, url="127.0.0.1:1"),
                     Settings(config_file=tmp_path, keys_file=keys, otlp_traces_endpoint="http://127.0.0.1:9/v1/t"))
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend.inner = FakeBackend([[i] for i in rt.tokenizer.encode("Hello there")])
    caplog.set_level("INFO", logger="openai_api.access")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        r = await c.post("/v1/chat/completions", json=body,
                         headers={"Authorization": "Bearer sk-a", "traceparent":
                                  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
        assert r.status_code == 200
    await app.state.gateway.process.close()
    [record] = [rec for rec in caplog.records if rec.name == "openai_api.access"]
    line = json.loads(logs.JSONFormatter().format(record))
    assert line["key"] == "team-a" and line["model"] == MODEL and line["status"] == 200
    assert line["duration_ms"] > 0 and line["ttft_ms"] > 0 and line["completion_tokens"] == 2
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c" and len(line["span_id"]) == 16
    assert "sk-a" not in json.dumps(line) and hashlib.sha256(b"sk-a").hexdigest() not in json.dumps(line)
    assert "key=team-a" in record.getMessage() and "trace_id=0af7651916cd43dd8448eb211c80319c" in record.getMessage()
