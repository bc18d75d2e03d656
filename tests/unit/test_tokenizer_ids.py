"""TextTokenizer's ids-only encoding gives exactly the ids of `tokenizers`' full `encode`."""

from __future__ import annotations

import random

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
