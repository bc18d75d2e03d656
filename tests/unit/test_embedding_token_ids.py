"""Token-id input to /v1/embeddings (issue #20): OpenAI's cl100k_base ids (what LangChain's
OpenAIEmbeddings sends by default) are decoded back to their text offline and embedded as that text;
the model's own ids where its config says so; a 400 where it refuses them or an id is not in cl100k.
The oracle for the decoded text is tiktoken's own cl100k_base encoding of the text, loaded in the test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tiktoken

from openai_api.config import BUNDLED_CONFIG, ConfigError, EmbeddingModel, load_config
from openai_api.errors import InvalidRequestError
from openai_api.services.embeddings import EmbeddingsService
from openai_api.services.registry import EncoderRuntime
from openai_api.text import cl100k
from openai_api.text.tokenizer import TextTokenizer
from tests.helpers import MODELS, missing_models

EMB = "all-minilm-l6-v2"
TEXTS = ["How do rivers form?", "Ünïcödé, emoji 🚀 and <|endoftext|> as plain text", " leading space\n\nand lines"]


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    """cl100k_base as the test loads it itself (tiktoken from the same offline file), not the code under test."""
    try:
        enc = cl100k.cl100k()
    except cl100k.VocabularyUnavailable as e:
        pytest.skip(str(e))
    folder = next(f for f in cl100k._folders() if (f / cl100k.CACHE_NAME).is_file())
    ranks = tiktoken.load.load_tiktoken_bpe(str(folder / cl100k.CACHE_NAME), expected_hash=cl100k.SHA256)
    own = tiktoken.Encoding("cl100k-test", pat_str=enc._pat_str, mergeable_ranks=ranks,
                            special_tokens=dict(enc._special_tokens))
    assert own.encode_ordinary("Hello world") == [9906, 1917]  # OpenAI's documented ids for this text
    return own


def test_cl100k_ids_decode_to_the_exact_text(reference: tiktoken.Encoding) -> None:
    for text in TEXTS:
        assert cl100k.decode(reference.encode_ordinary(text)) == text
    assert cl100k.decode([reference.encode_single_token("<|endoftext|>")]) == "<|endoftext|>"
    for bad in ([100256], [100261], [100275], [100277], [-1], [2**40]):
        assert cl100k.decode(bad) is None, bad


def test_a_missing_vocabulary_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cl100k, "_folders", lambda: [tmp_path])
    (tmp_path / cl100k.CACHE_NAME).write_bytes(b"not the vocabulary")  # wrong hash: never used (nor deleted)
    cl100k.cl100k.cache_clear()
    try:
        with pytest.raises(cl100k.VocabularyUnavailable) as e:
            cl100k.cl100k()
        assert "\n" not in str(e.value) and "cl100k_base" in str(e.value) and str(tmp_path) in str(e.value)
        assert (tmp_path / cl100k.CACHE_NAME).read_bytes() == b"not the vocabulary"
    finally:
        cl100k.cl100k.cache_clear()


def _config(tmp_path: Path, **entry: Any) -> Path:
    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    emb = {**next(e for e in data["embedding"] if e["name"] == EMB), **entry}
    emb["path"] = str((BUNDLED_CONFIG.parent / emb["path"]).resolve())
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps({"embedding": [emb]}), encoding="utf-8")
    return path


@pytest.mark.skipif(bool(missing_models(EMB)), reason="the bundled models are not prepared")
def test_the_setting_defaults_to_cl100k_and_a_missing_vocabulary_stops_start_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(_config(tmp_path)).embedding[0].token_ids == "cl100k_base"
    assert load_config(_config(tmp_path, token_ids="refuse")).embedding[0].token_ids == "refuse"
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path, token_ids="cl100k"))
    assert e.value.field == "embedding[0].token_ids"

    def unavailable() -> tiktoken.Encoding:
        raise cl100k.VocabularyUnavailable("OpenAI's cl100k_base vocabulary is not on this machine")

    monkeypatch.setattr(cl100k, "cl100k", unavailable)
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path))
    assert e.value.field == "embedding[0].token_ids" and "refuse" in str(e.value) and "\n" not in str(e.value)
    load_config(_config(tmp_path, token_ids="refuse"))  # nothing to load: starts
    load_config(_config(tmp_path, accept_token_ids=True))


def _service_and_runtime(**cfg: Any) -> tuple[EmbeddingsService, EncoderRuntime[EmbeddingModel]]:
    if reason := missing_models(EMB):
        pytest.skip(reason)
    config = EmbeddingModel(name=EMB, url="127.0.0.1:1", path=MODELS / EMB, max_tokens=256, **cfg)
    rt = EncoderRuntime(config, TextTokenizer.from_folder(MODELS / EMB), None)  # type: ignore[arg-type]
    return EmbeddingsService(None, None), rt  # type: ignore[arg-type]


def test_cl100k_ids_become_the_same_model_tokens_as_their_text(reference: tiktoken.Encoding) -> None:
    svc, rt = _service_and_runtime()
    ids = [reference.encode_ordinary(t) for t in TEXTS]
    as_ids = svc._tokenize(rt, None, ids, None, "none", "input")
    assert as_ids == svc._tokenize(rt, TEXTS, None, None, "none", "input")
    with pytest.raises(InvalidRequestError) as e:
        svc._tokenize(rt, None, [ids[0], [100261]], None, "none", "input")
    assert e.value.param == "input" and "input[1]" in e.value.message and "cl100k_base" in e.value.message


def test_own_ids_and_refusal_follow_the_config(reference: tiktoken.Encoding) -> None:
    svc, own = _service_and_runtime(token_ids="accept_token_ids")
    mini = own.tokenizer.encode("How do rivers form?")
    assert svc._tokenize(own, None, [mini], None, "none", "input") == \
        svc._tokenize(own, ["How do rivers form?"], None, None, "none", "input")
    svc, older = _service_and_runtime(accept_token_ids=True)  # the older spelling
    assert svc._tokenize(older, None, [mini], None, "none", "input") == \
        svc._tokenize(own, None, [mini], None, "none", "input")
    svc, refusing = _service_and_runtime(token_ids="refuse")
    with pytest.raises(InvalidRequestError) as e:
        svc._tokenize(refusing, None, [reference.encode_ordinary("x")], None, "none", "input")
    assert e.value.code == "token_ids_not_accepted" and "check_embedding_ctx_length=False" in e.value.message
