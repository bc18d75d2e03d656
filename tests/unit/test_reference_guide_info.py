"""The reference LLM's xgrammar tokenizer view (smollm2_guide.GuideCompiler._tokenizer_info, built from
tokenizer.json with the tokenizers library) is the one xgrammar's own `TokenizerInfo.from_huggingface` builds from
transformers' tokenizer: the same vocabulary, special and stop tokens and metadata."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import MODELS, REPO

WEIGHTS = MODELS / "smollm2-135m-instruct"


def test_tokenizer_info_matches_xgrammars_own() -> None:
    xgr = pytest.importorskip("xgrammar")
    transformers = pytest.importorskip("transformers")
    if not (WEIGHTS / "config.json").is_file():
        pytest.skip(f"{WEIGHTS} is not prepared (scripts/setup.sh)")
    sys.path.insert(0, str(REPO / "triton_models" / "smollm2-135m-instruct" / "1"))
    from smollm2_guide import GuideCompiler

    config = json.loads((WEIGHTS / "config.json").read_text(encoding="utf-8"))
    vocab, eos = int(config["vocab_size"]), int(config["eos_token_id"])
    ours = GuideCompiler(WEIGHTS, vocab, [eos])._tokenizer_info(xgr)
    theirs = xgr.TokenizerInfo.from_huggingface(transformers.AutoTokenizer.from_pretrained(str(WEIGHTS)),
                                                vocab_size=vocab, stop_token_ids=[eos])
    assert ours.dump_metadata() == theirs.dump_metadata()
    assert ours.decoded_vocab == theirs.decoded_vocab and len(ours.decoded_vocab) == vocab
    assert ours.special_token_ids == theirs.special_token_ids and ours.stop_token_ids == theirs.stop_token_ids == [eos]
