"""load_config: the seed format loads unchanged; every problem is one line naming file, field and reason."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from openai_api.config import BUNDLED_TEMPLATES, ConfigError, GatewayConfig, check_config, load_config
from tests.helpers import REPO

# The example config of the seed system's manual (shared/seeds/002), verbatim but for the `path`s,
# which the fixture points at temporary tokenizer folders.
SEED_CONFIG: dict[str, Any] = {
    "model_infos": [
        {
            "name": "chatglm2-6b",
            "start_id": -1,
            "end_id": -2,
            "max_len": 2048,
            "bad_words": [[7768, 3908], [1, 2]],
            "stop_words": [[2], [2]],
            "temperature": 1,
            "repetition_penalty": 1,
            "mask_positions": 1,
        }
    ],
    "llm": [
        {
            "name": "chatglm2-6b",
            "url": "127.0.0.1:8001",
            "path": "/LocalRun/void_main_ft_with_llama/chatglm2-6b",
            "chat_template": "chatglm2.jinja",
        }
    ],
    "embedding": [
        {
            "name": "bge_large_zh_v1_5",
            "url": "127.0.0.1:8000",
            "path": "/LocalRun/model_zoo/bge-large-zh-v1.5",
            "max_tokens": 512,
        }
    ],
    "rerank": [
        {
            "name": "bge-reranker",
            "url": "127.0.0.1:8000",
            "path": "/LocalRun/model_zoo/bge-reranker",
            "max_tokens": 512,
            "input_config": {"input_ids": "input_ids", "attention_mask": "attention_mask"},
            "output_config": {"name": "logits", "process": "normalize"},
        }
    ],
}


def make_tokenizer_dir(folder: Path) -> Path:
    """A folder holding a minimal but real tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    Tokenizer(WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture
def seed_config(tmp_path: Path) -> dict[str, Any]:
    """The seed example with each `path` pointing at its own tokenizer folder under tmp_path."""
    cfg = copy.deepcopy(SEED_CONFIG)
    for kind in ("llm", "embedding", "rerank"):
        cfg[kind][0]["path"] = str(make_tokenizer_dir(tmp_path / "models" / cfg[kind][0]["name"]))
    return cfg


def write(tmp_path: Path, data: Any, name: str = "model_config.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def config_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


def assert_names(err: ConfigError, path: Path, field: str, *reason_words: str) -> None:
    """The one line names the file, the field and the reason."""
    msg = str(err)
    assert "\n" not in msg
    assert str(path) in msg
    assert err.field == field
    if field:
        assert f": {field}: " in msg
    for word in reason_words:
        assert word.lower() in err.reason.lower(), (word, msg)


# --- the seed format ---------------------------------------------------------------------------------


def test_seed_example_config_loads_unchanged(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    config = load_config(write(tmp_path, seed_config))
    assert isinstance(config, GatewayConfig)

    info = config.model_info("chatglm2-6b")
    assert (info.start_id, info.end_id, info.max_len) == (-1, -2, 2048)
    assert info.bad_words == [[7768, 3908], [1, 2]]
    assert info.stop_words == [[2], [2]]
    assert info.temperature == 1 and info.repetition_penalty == 1
    assert info.mask_positions == 1  # the seed's FasterTransformer key: declared, so the seed config loads

    (llm,) = config.llm
    assert (llm.name, llm.url, llm.kind) == ("chatglm2-6b", "127.0.0.1:8001", "llm")
    assert llm.path == Path(seed_config["llm"][0]["path"]).resolve()

    (emb,) = config.embedding
    assert (emb.name, emb.url, emb.max_tokens, emb.kind) == ("bge_large_zh_v1_5", "127.0.0.1:8000", 512, "embedding")

    (rr,) = config.rerank
    assert (rr.name, rr.max_tokens, rr.kind) == ("bge-reranker", 512, "rerank")
    assert rr.input_config == {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    assert (rr.output_config.name, rr.output_config.process) == ("logits", "normalize")

    assert [m.name for m in config.all_models()] == ["chatglm2-6b", "bge_large_zh_v1_5", "bge-reranker"]
    assert config.source == (tmp_path / "model_config.json").resolve()


def test_bare_template_name_resolves_to_the_bundled_chat_templates(tmp_path: Path,
                                                                   seed_config: dict[str, Any]) -> None:
    config = load_config(write(tmp_path, seed_config))
    assert config.llm[0].chat_template == (BUNDLED_TEMPLATES / "chatglm2.jinja").resolve()
    assert config.llm[0].chat_template.is_file()


def test_template_next_to_the_config_wins_over_the_bundled_one(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    (tmp_path / "chat_templates").mkdir()
    local = tmp_path / "chat_templates" / "chatglm2.jinja"
    local.write_text("{{ messages[0]['content'] }}")
    config = load_config(write(tmp_path, seed_config))
    assert config.llm[0].chat_template == local.resolve()


def test_relative_paths_resolve_against_the_config_folder_not_the_cwd(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_dir = tmp_path / "conf"
    make_tokenizer_dir(cfg_dir / "tok")
    (cfg_dir / "my.jinja").write_text("{{ messages }}")
    path = write(cfg_dir, {"llm": [{"name": "m", "url": "h:1", "path": "tok", "chat_template": "my.jinja"}],
                           "embedding": [{"name": "e", "url": "h:2", "path": "./tok"}]})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(path)
    assert config.llm[0].path == (cfg_dir / "tok").resolve()
    assert config.embedding[0].path == (cfg_dir / "tok").resolve()
    assert config.llm[0].chat_template == (cfg_dir / "my.jinja").resolve()


def test_optional_kinds_may_be_omitted(tmp_path: Path) -> None:
    make_tokenizer_dir(tmp_path / "tok")
    config = load_config(write(tmp_path, {"embedding": [{"name": "e", "url": "h:1", "path": "tok"}]}))
    assert config.llm == [] and config.rerank == [] and config.model_infos == []
    assert config.model_info("anything").name == "anything"


# --- one test per error --------------------------------------------------------------------------------


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    err = config_error(path)
    assert_names(err, path, "", "not found")


def test_bad_json_reports_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "llm": [\n    {"name": "x",, }\n  ]\n}\n')
    err = config_error(path)
    assert_names(err, path, "", "invalid JSON", "line 3", "column 18")


def test_top_level_that_is_not_an_object_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, [{"name": "x"}])
    err = config_error(path)
    assert_names(err, path, "", "top level", "object")


def test_unknown_model_kind_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, {"llm": [], "foo": []})
    err = config_error(path)
    assert_names(err, path, "foo", "unknown model kind")


def test_missing_required_field_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    del seed_config["llm"][0]["url"]
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "llm[0].url", "missing required field")


def test_wrong_type_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["embedding"][0]["max_tokens"] = "lots"
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "embedding[0].max_tokens", "integer")


def test_wrong_type_inside_a_union_names_the_entry_not_the_union_branch(tmp_path: Path,
                                                                        seed_config: dict[str, Any]) -> None:
    seed_config["model_infos"][0]["stop_words"] = [[2], 5]
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "model_infos[0].stop_words[1]")


def test_unknown_field_in_an_llm_entry_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["llm"][0]["chat_templte"] = "chatglm2.jinja"
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "llm[0].chat_templte", "unknown field")


def test_template_file_not_found_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["llm"][0]["chat_template"] = "no-such-template.jinja"
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "llm[0].chat_template", "template file not found", "no-such-template.jinja")


def test_template_that_does_not_compile_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    bad = tmp_path / "broken.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    seed_config["llm"][0]["chat_template"] = str(bad)
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "llm[0].chat_template", "syntax error", "line 1")


def test_tokenizer_folder_not_found_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["embedding"][0]["path"] = "/LocalRun/model_zoo/bge-large-zh-v1.5"
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "embedding[0].path", "tokenizer folder not found", "bge-large-zh-v1.5")


def test_folder_without_tokenizer_json_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    seed_config["rerank"][0]["path"] = str(empty)
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "rerank[0].path", "no tokenizer.json", str(empty))


def test_duplicate_model_names_within_a_kind_are_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["llm"].append(dict(seed_config["llm"][0]))
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert_names(err, path, "llm", "duplicate model name", "chatglm2-6b")


def test_duplicate_model_names_across_kinds_are_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["rerank"][0]["name"] = "bge_large_zh_v1_5"
    path = write(tmp_path, seed_config)
    err = config_error(path)
    assert str(path) in str(err)
    assert "bge_large_zh_v1_5" in err.reason and "embedding" in err.reason and "rerank" in err.reason


def test_unknown_key_in_a_model_infos_entry_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["model_infos"][0]["temprature"] = 0.2  # a typo must not silently leave the default
    path = write(tmp_path, seed_config)
    assert_names(config_error(path), path, "model_infos[0].temprature", "unknown field")


def test_a_model_infos_entry_naming_no_llm_is_reported(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["model_infos"].append({"name": "chatglm2-6B", "max_len": 4096})  # the llm is "chatglm2-6b"
    path = write(tmp_path, seed_config)
    assert_names(config_error(path), path, "model_infos[1].name", "'chatglm2-6B' names no llm entry", "chatglm2-6b")
    # An embedding or rerank name is no llm either: model_infos hold generation defaults.
    seed_config["model_infos"][1]["name"] = "bge-reranker"
    assert_names(config_error(write(tmp_path, seed_config)), path, "model_infos[1].name", "names no llm entry")


def test_a_config_built_in_code_keeps_the_naming_rules() -> None:
    with pytest.raises(ValueError, match="names no llm entry"):
        GatewayConfig.model_validate({"model_infos": [{"name": "ghost"}]})
    with pytest.raises(ValueError, match="used by both llm and embedding"):
        GatewayConfig.model_validate({"llm": [{"name": "a", "url": "h:1", "path": "x"}],
                                      "embedding": [{"name": "a", "url": "h:1", "path": "x"}]})


def test_check_config_lists_every_problem_in_file_order(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    seed_config["extra_kind"] = []
    seed_config["model_infos"][0]["temprature"] = 0.2
    seed_config["model_infos"].append({"name": "ghost"})
    seed_config["llm"].append({"name": "second", "url": "h:1", "path": seed_config["llm"][0]["path"],
                               "chat_templte": "x.jinja"})  # invalid: left out, yet the third llm keeps its index
    seed_config["llm"].append({"name": "third", "url": "h:1", "path": str(tmp_path / "gone"),
                               "chat_template": "no-such.jinja"})
    seed_config["embedding"][0]["max_tokens"] = "lots"
    seed_config["rerank"][0]["name"] = "third"
    path = write(tmp_path, seed_config)
    config, problems = check_config(path)
    found = [(p.field, p.reason) for p in problems]
    assert [f for f, _ in found] == ["extra_kind", "model_infos[0].temprature", "llm[1].chat_templte",
                                     "embedding[0].max_tokens", "", "model_infos[1].name", "llm[2].path",
                                     "llm[2].chat_template"], found
    assert "used by both llm and rerank" in found[4][1] and "tokenizer folder not found" in found[6][1]
    assert all(str(path) in str(p) and "\n" not in str(p) for p in problems)
    assert config is not None and [m.name for m in config.llm] == ["chatglm2-6b", "third"]
    # load_config stops at the first of them.
    assert (config_error(path).field, config_error(path).reason) == found[0]


def test_check_config_of_a_good_config_finds_nothing(tmp_path: Path, seed_config: dict[str, Any]) -> None:
    config, problems = check_config(write(tmp_path, seed_config))
    assert problems == [] and config is not None and len(config.all_models()) == 3


# --- the command line ------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [None, "{not json", '{"llm": [{"name": "x"}]}'],
                         ids=["missing-file", "bad-json", "missing-field"])
def test_cli_with_a_bad_config_exits_2_with_one_line_and_no_traceback(tmp_path: Path, content: str | None) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    proc = subprocess.run([sys.executable, "openai_api_cli.py", "--config-file", str(bad)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(bad) in lines[0]
    assert proc.stdout == ""
