"""Each setting is declared once (`openai_api.settings`): its flag, environment variable and README row all
come from that declaration, with a flag over the environment over the default."""

from __future__ import annotations

import pytest

from openai_api.cli import parse_args
from openai_api.settings import Settings, markdown_table, options, usable_cores
from tests.helpers import REPO


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
    assert settings([], {"OPENAI_API_STREAM_FLUSH_INTERVAL_S": "0"}).stream_flush_interval_s == 0.0
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


def test_the_readme_table_is_generated_from_the_settings() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme, "README's command-line table is stale: python -m openai_api.settings"


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


def test_a_responses_store_is_refused_with_several_workers() -> None:
    """The store is one process's memory: behind several workers previous_response_id would fail at random."""
    with pytest.raises(ValueError, match=r"^--responses-store keeps answers in one process's memory"):
        settings(["--workers", "2", "--responses-store", "100"])
    assert settings(["--workers", "1", "--responses-store", "100"]).responses_store == 100


def test_allowed_only_image_fetching_needs_allowed_hosts() -> None:
    with pytest.raises(ValueError, match="--image-allowed-hosts"):
        settings(["--image-fetch", "allowed_only"])
    s = settings(["--image-fetch", "allowed_only", "--image-allowed-hosts", "images.internal"])
    assert s.image_fetch == "allowed_only" and settings([], {"OPENAI_API_IMAGE_FETCH": "off"}).image_fetch == "off"
