"""Property-based fuzzing of the gateway against its own OpenAPI schema (schemathesis), in-process.

    python scripts/fuzz.py                 # 300 cases per route
    python scripts/fuzz.py --examples 32   # what tests/unit/test_limits_fuzz.py runs

The app is the real one (routers, middleware, services, tokenizers, templates) with the Triton adapters
replaced by fakes, so any 5xx is a gateway bug. For every operation in /openapi.json, schemathesis
generates requests (valid and invalid) and checks: no 5xx, every status code and content type is the
one the schema documents, and every response body matches the documented schema. Exit code 0 = pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from openai_api.config import BUNDLED_CONFIG, load_config  # noqa: E402
from openai_api.triton.llm import GUIDE_KINDS, GenerationChunk, GenerationRequest  # noqa: E402


class FakeLLM:
    model = "fake"
    protocol = "tensorrt_llm"
    guide_kinds = GUIDE_KINDS

    def supports(self, param: str) -> bool:
        return True

    async def check(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        for t in range(min(request.max_tokens, 8)):
            yield GenerationChunk(token_ids=[100 + t])


class FakeEncoder:
    """Answers like a BERT encoder: `[B, L, 384]` hidden states, or `[B, 1]` logits for rerank."""

    max_batch_size = None

    def __init__(self, rerank: bool) -> None:
        self.rerank = rerank

    async def check(self) -> None:
        return None

    async def infer(self, features: dict[str, np.ndarray]) -> np.ndarray:
        b, length = features["input_ids"].shape
        rng = np.random.default_rng(b * 31 + length)
        if self.rerank:
            return rng.standard_normal((b, 1)).astype(np.float32)
        return rng.standard_normal((b, length, 384)).astype(np.float32)


def build_app() -> Any:
    from openai_api.app import create_app
    from openai_api.settings import Settings

    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    for kind in ("llm", "embedding", "rerank"):
        for entry in data.get(kind, []):
            for key in ("path", "chat_template"):
                if entry.get(key):
                    entry[key] = str((BUNDLED_CONFIG.parent / entry[key]).resolve())
            entry["url"] = "127.0.0.1:1"  # nothing listens: readiness is a deterministic 503
    folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
    (folder / "model_config.json").write_text(json.dumps(data), encoding="utf-8")
    config = load_config(folder / "model_config.json")
    app = create_app(config, Settings(config_file=folder / "model_config.json", max_messages=64,
                                      max_embedding_inputs=64, max_rerank_documents=64))
    reg = app.state.gateway.services.registry
    for rt in reg.llms.values():
        rt.backend.inner = FakeLLM()
    for enc in reg.encoders.values():
        enc.adapter.inner = FakeEncoder(enc.config.kind == "rerank")
    return app


def run(examples: int, seed: int = 0) -> list[str]:
    """Fuzz every operation; returns the failures (empty = pass)."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    schema = schemathesis.openapi.from_asgi("/openapi.json", build_app())
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        # Readiness (and /ping, its SageMaker name) without a Triton is a documented 503; nothing else may 5xx.
        op_checks = checks[1:] if operation.path in ("/health/ready", "/ping") else checks

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case: Any) -> None:
            case.call_and_validate(checks=op_checks)  # noqa: B023 - runs before the loop moves on

        try:
            fuzz()
        except Exception as e:  # noqa: BLE001 - collected and reported per operation
            failures.append(f"{operation.method.upper()} {operation.path}: {e}")
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=300, help="cases per route (default 300)")
    args = p.parse_args(argv)
    failures = run(args.examples)
    for f in failures:
        print(f"FAIL {f}\n")
    print("PASS" if not failures else f"{len(failures)} operations failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
