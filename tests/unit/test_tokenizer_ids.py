"""TextTokenizer's ids-only encoding gives exactly the ids of `tokenizers`' full `encode`."""

from __future__ import annotations

import random
from typing import Any

import pytest

from openai_api.errors import InvalidRequestError
from openai_api.text.tokenizer import TextTokenizer
from tests.helpers import MODELS, missing_models

SMOLLM2_DIR = MODELS / "smollm2-135m-instruct"

if reason := missing_models(SMOLLM2_DIR.name):
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return TextTokenizer.from_folder(SMOLLM2_DIR)


def _texts() -> list[str]:
    rng = random.Random(7)
    alphabet = "abc XYZ\n\t éß世界😀<|>_/im_start" + "0123456789"
    markup = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    texts = ["", " ", markup, markup * 3]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(300)]
    return texts


def test_ids_match_the_full_encode(tok: TextTokenizer) -> None:
    hf = tok.tokenizer
    texts = _texts()
    for text in texts:
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids, text
        assert tok.encode(text, add_special_tokens=True) == hf.encode(text, add_special_tokens=True).ids, text
    assert tok.encode_batch(texts) == [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]


def test_plain_encoding_still_reads_markup_as_text(tok: TextTokenizer) -> None:
    special = tok.encode("<|im_start|>")
    assert len(special) == 1
    assert special[0] not in tok.encode_plain("<|im_start|>")


def test_text_no_tokenizer_takes_is_a_400(tok: TextTokenizer) -> None:
    for call in (lambda: tok.encode("a\ud800b"), lambda: tok.encode_plain("a\ud800b"),
                 lambda: tok.encode_batch(["ok", "a\ud800b"])):
        with pytest.raises(InvalidRequestError):
            call()


def test_completions_prompts_get_the_tokenizers_bos_unless_asked_not_to(tok: TextTokenizer) -> None:
    """A Llama-style tokenizer (a post-processor that puts BOS first): a text prompt of `/v1/completions` gets
    it by default, as vLLM's does, and not with `add_special_tokens: false`; token ids go as given."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    from openai_api.schemas.openai import CompletionRequest
    from openai_api.services.completions import _prompts

    hf = Tokenizer.from_str(tok.tokenizer.to_str())
    bos_id = hf.token_to_id("<|im_start|>")
    hf.post_processor = TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos_id)])
    llama_like = TextTokenizer(folder=tok.folder, tokenizer=hf, bos_token="<|im_start|>", eos_token=tok.eos_token,
                               eos_token_ids=tok.eos_token_ids)
    rt: Any = SimpleNamespace(tokenizer=llama_like, context_length=2048)
    plain = tok.encode("Once upon a time")
    assert CompletionRequest(model="m", prompt="x").add_special_tokens is True
    assert _prompts(rt, "Once upon a time", True) == [("Once upon a time", [bos_id, *plain])]
    assert _prompts(rt, ["Once upon a time"], False) == [("Once upon a time", plain)]
    assert _prompts(rt, [plain], True)[0][1] == plain
