"""Guides compiled the way the reference LLM compiles them: its own `smollm2_guide.GuideCompiler` (xgrammar, strict
mode, no free whitespace) over SmolLM2's tokenizer, reading the guide from the TensorRT-LLM wire tensors as the
model reads them. Tests that need it skip when xgrammar or the prepared model folder is missing."""

from __future__ import annotations

import json
import sys
from functools import cache
from typing import Any

import pytest

from openai_api.triton.llm import Guide
from tests.helpers import MODELS, REPO

WEIGHTS = MODELS / "smollm2-135m-instruct"


@cache
def _compiler() -> Any:
    pytest.importorskip("xgrammar")
    pytest.importorskip("transformers")
    if not (WEIGHTS / "config.json").is_file():
        pytest.skip(f"{WEIGHTS} is not prepared (scripts/setup.sh)")
    sys.path.insert(0, str(REPO / "triton_models" / "smollm2-135m-instruct" / "1"))
    from smollm2_guide import GuideCompiler

    config = json.loads((WEIGHTS / "config.json").read_text(encoding="utf-8"))
    compiler = GuideCompiler(WEIGHTS, int(config["vocab_size"]), [int(config["eos_token_id"])])
    compiler.ready()
    return compiler


def compile_error(guide: Guide) -> str | None:
    """The reference model's refusal of `guide` (its message, as it would answer the request), or None."""
    compiler = _compiler()
    from smollm2_guide import GuideError, trtllm_guide

    try:
        assert guide.kind == "json_schema" and guide.value is not None
        compiler.compile(trtllm_guide("json_schema", guide.value))
    except GuideError as e:
        return str(e)
    return None


def accepts(guide: Guide, output: Any) -> bool:
    """Whether the compiled guide lets the model write `output` (JSON, written as the guide's separators
    allow: `", "` and `": "`) and end there."""
    compiler = _compiler()
    from smollm2_guide import trtllm_guide

    assert guide.kind == "json_schema" and guide.value is not None
    compiled, _, _ = compiler.compile(trtllm_guide("json_schema", guide.value))
    matcher = compiler._xgr.GrammarMatcher(compiled)
    return bool(matcher.accept_string(json.dumps(output))) and bool(matcher.is_completed())
