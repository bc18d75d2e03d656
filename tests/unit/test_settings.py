"""Each setting is declared once (`openai_api.settings`): its flag, environment variable and docs row all
come from that declaration, with a flag over the environment over the default."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from openai_api.cli import parse_args
from openai_api.settings import Settings, markdown_table, options, usable_cores
from tests.helpers import REPO, free_port
from tests.unit.fakes import llm_only_config


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return Settings.from_args(parse_args(argv), env or {})


def test_defaults_come_from_the_model() -> None:
    s = settings([])
    assert s == Settings(cpu_workers=s.cpu_workers)
    assert s.stream_flush_interval_s == 0.002 and s.stream_idle_timeout_s == 60.0 and s.access_log


def test_a_flag_wins_over_the_environment_which_wins_over_the_default() -> None:
    env = {"OPENAI_API_MAX_IN_FLIGHT": "64", "OPENAI_API_PORT": "7000"}
    s = settings(["--max-in-flight", "32"], env)
    assert s.max_in_flight == 32 and s.port == 7000 and s.host == "localhost"


def test_units_negations_and_lists() -> None:
    s = settings(["--stream-flush-interval", "5", "--no-access-log", "--api-key", "a", "--api-key", "b",
                  "--stream-idle-timeout", "0"], {"OPENAI_API_KEYS": "c, d", "OPENAI_API_CORS_ORIGINS": "https://x"})
    assert s.stream_flush_interval_s == pytest.approx(0.005)
    assert s.access_log is False and s.api_keys == ["a", "b", "c", "d"] and s.cors_origins == ["https://x"]
    assert s.stream_idle_timeout_s is None  # 0 = never
    assert settings([], {"OPENAI_API_STREAM_FLUSH_INTERVAL_MS": "0"}).stream_flush_interval_s == 0.0
    assert settings([], {"OPENAI_API_ACCESS_LOG": "false"}).access_log is False


def test_prompts_are_logged_only_when_asked_twice() -> None:
    assert settings(["--log-prompts"]).log_prompts is False
    assert settings(["--log-prompts", "--verbose"]).log_prompts is True


def test_a_bad_value_names_the_flag_and_the_variable() -> None:
    with pytest.raises(ValueError, match="--cpu-workers / OPENAI_API_CPU_WORKERS"):
        settings(["--cpu-workers", "0"])
    with pytest.raises(ValueError, match="OPENAI_API_MAX_MESSAGES"):
        settings([], {"OPENAI_API_MAX_MESSAGES": "many"})


def test_every_setting_has_a_flag_and_help() -> None:
    flags = [opt for _, opt in options()]
    assert len(flags) == len(Settings.model_fields) - 1  # all but open_paths, which is not a setting
    assert all(opt.help for opt in flags)


def test_the_docs_table_is_generated_from_the_settings() -> None:
    page = (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert markdown_table() in page, (
        "docs/reference/cli.md's table of flags is stale: run `.venv/bin/python scripts/docs.py`")


def test_workers_take_a_number_or_auto_from_the_flag_or_the_environment() -> None:
    assert settings([]).workers == 1
    assert settings(["--workers", "3"]).workers == 3
    assert settings([], {"OPENAI_API_WORKERS": "2"}).workers == 2
    assert settings(["--workers", "auto"]).workers == usable_cores()
    assert settings([], {"OPENAI_API_WORKERS": "auto"}).workers == usable_cores()
    with pytest.raises(ValueError, match="--workers / OPENAI_API_WORKERS: Input should be greater than or equal to 1"):
        settings(["--workers", "0"])
    with pytest.raises(ValueError, match="OPENAI_API_WORKERS: expected a number of processes or auto"):
        settings([], {"OPENAI_API_WORKERS": "many"})
    with pytest.raises(SystemExit):  # argparse: "argument --workers: expected a number of processes or auto"
        settings(["--workers", "many"])


def test_a_responses_store_in_memory_is_refused_with_several_workers_and_shared_otherwise() -> None:
    """One process's memory behind several workers would make previous_response_id fail at random; unset, the
    workers share an SQLite file (the supervisor names it); a URL of another kind is refused with the kinds."""
    with pytest.raises(ValueError, match=r"^--responses-store-url memory keeps answers in one process's memory"):
        settings(["--workers", "2", "--responses-store", "100", "--responses-store-url", "memory"])
    assert settings(["--workers", "2", "--responses-store", "100"]).responses_store_url is None
    assert settings(["--workers", "2", "--responses-store", "9", "--responses-store-url", "sqlite:///var/x"]
                    ).responses_store == 9
    assert settings([], {"OPENAI_API_RESPONSES_STORE_URL": "redis://127.0.0.1:6379/0"}).responses_store_url \
        == "redis://127.0.0.1:6379/0"
    with pytest.raises(ValueError, match="is not a store URL: memory, sqlite:///DIR"):
        settings(["--responses-store-url", "postgres://x"])
    with pytest.raises(ValueError, match="names no folder"):
        settings(["--responses-store-url", "sqlite:"])
    assert settings(["--workers", "1", "--responses-store", "100"]).responses_store == 100


def test_readiness_asks_for_one_ready_model_unless_told_otherwise() -> None:
    assert settings([]).ready_models == "any"
    assert settings(["--ready-models", "all"]).ready_models == "all"
    assert settings([], {"OPENAI_API_READY_MODELS": "none"}).ready_models == "none"


def test_allowed_only_image_fetching_needs_allowed_hosts() -> None:
    with pytest.raises(ValueError, match="--image-allowed-hosts"):
        settings(["--image-fetch", "allowed_only"])
    s = settings(["--image-fetch", "allowed_only", "--image-allowed-hosts", "images.internal"])
    assert s.image_fetch == "allowed_only" and settings([], {"OPENAI_API_IMAGE_FETCH": "off"}).image_fetch == "off"


def test_millisecond_settings_have_ms_variables_and_the_old_s_names_still_read_as_milliseconds_with_a_warning(
        ) -> None:
    """`OPENAI_API_REDIS_TIMEOUT_S=1` was a 1 ms budget: a variable named `_S` that took milliseconds. The
    variables are `_MS` now; the old names keep their meaning (what the README said) for a release, warned."""
    s = settings([], {"OPENAI_API_REDIS_TIMEOUT_MS": "250", "OPENAI_API_STREAM_FLUSH_INTERVAL_MS": "5"})
    assert s.redis_timeout_s == pytest.approx(0.25) and s.stream_flush_interval_s == pytest.approx(0.005)
    assert s.start_warnings() == []
    old = settings([], {"OPENAI_API_REDIS_TIMEOUT_S": "250"})
    assert old.redis_timeout_s == pytest.approx(0.25)
    assert any("OPENAI_API_REDIS_TIMEOUT_S" in w and "OPENAI_API_REDIS_TIMEOUT_MS" in w for w in old.start_warnings())
    both = settings([], {"OPENAI_API_STREAM_FLUSH_INTERVAL_S": "9", "OPENAI_API_STREAM_FLUSH_INTERVAL_MS": "1"})
    assert both.stream_flush_interval_s == pytest.approx(0.001)
    assert any("ignored" in w for w in both.start_warnings())
    assert settings(["--redis-timeout", "20"], {"OPENAI_API_REDIS_TIMEOUT_MS": "250"}).redis_timeout_s == 0.02


def test_api_keys_come_from_a_file_too(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# the gateway's keys\n\n  sk-one  \nsk-two\n", encoding="utf-8")
    s = settings(["--api-key-file", str(keys), "--api-key", "sk-flag"])
    assert s.api_keys == ["sk-flag", "sk-one", "sk-two"]
    assert settings([], {"OPENAI_API_API_KEY_FILE": str(keys)}).api_keys == ["sk-one", "sk-two"]
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n", encoding="utf-8")
    for path in (empty, tmp_path / "missing"):
        with pytest.raises(ValueError, match="--api-key-file"):
            settings(["--api-key-file", str(path)])


def test_the_auth_mode_is_stated_as_it_is(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: []\n", encoding="utf-8")
    assert settings(["--keys-file", str(keys)]).auth_mode() == f"auth: the keys file {keys}"
    assert settings(["--api-key", "a", "--api-key", "b"]).auth_mode() == "auth: 2 API keys"
    both = settings(["--keys-file", str(keys), "--api-key", "a"])
    assert both.auth_mode() == f"auth: the keys file {keys} and 1 API key"
    assert settings([]).auth_mode().startswith("auth off")
    assert any("no API key" in w for w in settings(["--host", "0.0.0.0"]).start_warnings())
    assert settings(["--host", "0.0.0.0", "--keys-file", str(keys)]).start_warnings() == []


def test_the_cli_keeps_a_key_file_out_of_ps_and_logs_its_auth_mode(tmp_path: Path) -> None:
    """The gateway as started: with --keys-file and --api-key-file its start-up line says so (it said "API keys
    off" with a keys file alone), the key is nowhere in its command line, and it lets the key in."""
    key = "sk-from-a-file-0123456789"
    (tmp_path / "api-key").write_text(key + "\n", encoding="utf-8")
    (tmp_path / "keys.yaml").write_text("keys: []\n", encoding="utf-8")
    config = llm_only_config(tmp_path, url="127.0.0.1:1")
    port = free_port()
    log = tmp_path / "cli.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "openai_api_cli.py", "--host", "127.0.0.1", "--port", str(port),
                                 "--config-file", str(config.source), "--keys-file", str(tmp_path / "keys.yaml"),
                                 "--api-key-file", str(tmp_path / "api-key")], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while "gateway listening" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        line = next(x for x in log.read_text().splitlines() if "gateway listening" in x)
        assert "auth: the keys file" in line and "1 API key (--api-key-file)" in line and "off" not in line, line
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert key.encode() not in cmdline and b"--api-key-file" in cmdline
        url = f"http://127.0.0.1:{port}/v1/models"
        while time.monotonic() < deadline:  # the line comes just before the socket is bound
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert httpx.get(url, timeout=10).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
    finally:
        proc.kill()
        proc.wait(10)
