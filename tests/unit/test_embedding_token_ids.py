"""Token-id input to /v1/embeddings (issue #20): OpenAI's cl100k_base ids (what LangChain's
OpenAIEmbeddings sends by default) are decoded back to their text offline and embedded as that text;
the model's own ids where its config says so; a 400 where it refuses them or an id is not in cl100k.
The oracle for the decoded text is tiktoken's own cl100k_base encoding of the text, loaded in the test."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.registry

from openai_api.config import BUNDLED_CONFIG, ConfigError, EmbeddingModel, load_config
from openai_api.errors import InvalidRequestError
from openai_api.services.embeddings import EmbeddingsService
from openai_api.services.registry import EncoderRuntime
from openai_api.text import cl100k
from openai_api.text.tokenizer import TextTokenizer
from tests.helpers import MODELS, missing_models

EMB = "all-minilm-l6-v2"
TEXTS = ["How do rivers form?", "Ünïcödé, emoji 🚀 and <|endoftext|> as plain text", " leading space\n\nand lines"]


LITELLM_COPY = "litellm_core_utils/tokenizers"  # where litellm (a dev dependency) ships the same published file
URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"  # where tiktoken fetches it


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tiktoken.Encoding:
    """tiktoken's own cl100k_base (tiktoken_ext.openai_public's definition), reading the published file from
    litellm's copy through tiktoken's cache: neither the code under test nor the file the package ships."""
    spec = importlib.util.find_spec("litellm")
    roots = [Path(r) / LITELLM_COPY for r in (spec.submodule_search_locations or [])] if spec else []
    name = hashlib.sha1(URL.encode()).hexdigest()  # tiktoken's cache file name for the URL
    source = next((r / name for r in roots if (r / name).is_file()), None)
    if source is None:
        pytest.skip("litellm (the dev extra) is not installed: no independent copy of cl100k_base")
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    shutil.copyfile(source, cache / name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        mp.setattr(tiktoken.registry, "ENCODINGS", {})  # not one an earlier test loaded from elsewhere
        enc = tiktoken.get_encoding("cl100k_base")
    assert enc.encode_ordinary("Hello world") == [9906, 1917]  # OpenAI's documented ids for this text
    return enc


def test_the_shipped_vocabulary_is_tiktokens_cl100k_base(reference: tiktoken.Encoding) -> None:
    ours = cl100k.cl100k()
    assert hashlib.sha256(cl100k.VOCABULARY.read_bytes()).hexdigest() == cl100k.SHA256
    assert (ours._pat_str, ours._special_tokens, ours.n_vocab) == \
        (reference._pat_str, reference._special_tokens, reference.n_vocab)
    assert ours._mergeable_ranks == reference._mergeable_ranks
    for text in TEXTS:
        assert ours.encode(text, allowed_special="all") == reference.encode(text, allowed_special="all")


def test_cl100k_ids_decode_to_the_exact_text(reference: tiktoken.Encoding) -> None:
    for text in TEXTS:
        assert cl100k.decode(reference.encode_ordinary(text)) == text
    assert cl100k.decode([reference.encode_single_token("<|endoftext|>")]) == "<|endoftext|>"
    for bad in ([100256], [100261], [100275], [100277], [-1], [2**40]):
        assert cl100k.decode(bad) is None, bad


@pytest.mark.parametrize("content", [None, b"not the vocabulary"], ids=["missing", "altered"])
def test_a_missing_or_altered_vocabulary_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          content: bytes | None) -> None:
    path = tmp_path / "cl100k_base.tiktoken"
    if content is not None:
        path.write_bytes(content)
    monkeypatch.setattr(cl100k, "VOCABULARY", path)
    cl100k.cl100k.cache_clear()
    try:
        with pytest.raises(cl100k.VocabularyUnavailable) as e:
            cl100k.cl100k()
        assert "\n" not in str(e.value) and "cl100k_base" in str(e.value) and str(path) in str(e.value)
        if content is not None:
            assert path.read_bytes() == content  # never rewritten
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
