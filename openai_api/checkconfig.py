"""`openai-api check-config FILE [--probe]`: everything wrong with a model config, before it serves.

Three passes, each over every entry (a problem in one entry never hides another's):
1. the file as `load_config` reads it (`config.check_config`): JSON, fields and types, names across entries,
   tokenizer folders, chat templates compiled, LoRA adapters read, the cl100k_base vocabulary;
2. every model built as the gateway builds it at start-up (`services.registry.ModelRegistry`: tokenizer,
   template, parser families, token-level stop and bad words, backend assembly), for the entries pass 1
   found nothing wrong with;
3. with `--probe`, each model asked of its Triton at every static url (as the gateway does at start-up and on
   a reload): the model's config read and checked against the entry (protocol and tensors for an LLM, the
   input and output names of an encoder), and the model ready. `dns:///` urls are resolved at run time, so
   they are not probed.

Output: one line per problem on stdout, `FILE: FIELD: REASON` (the field in the file: `llm[2].path`), then
a summary. Exit status 0 when nothing was found, 1 when something was, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from openai_api.config import (
    DNS_SCHEME,
    ConfigError,
    EmbeddingModel,
    GatewayConfig,
    LLMModel,
    RerankModel,
    check_config,
)
from openai_api.errors import GatewayError
from openai_api.observability import Metrics
from openai_api.services.backends import encoder_backend, llm_backend
from openai_api.services.registry import ModelRegistry
from openai_api.triton.client import TritonClientPool
from openai_api.triton.encoder import EncoderBackend
from openai_api.triton.health import model_ready
from openai_api.triton.llm import LLMBackend

PROBE_TIMEOUT_S = 10.0


def build_models(config: GatewayConfig, skip: set[str]) -> list[ConfigError]:
    """Build each model entry (but those named in `skip`) alone, as the gateway builds them all; what fails is
    a problem naming the entry. No Triton is contacted."""
    file = config.source or Path("model_config.json")
    problems: list[ConfigError] = []
    pool, metrics = TritonClientPool(), Metrics()
    previous: ModelRegistry | None = None  # shares the tokenizers already loaded, as a reload does
    for where, m in config.entries():
        if where in skip:
            continue
        kind = where.split("[")[0]
        one = config.model_copy(update={k: [m] if k == kind else [] for k in ("llm", "embedding", "rerank")})
        try:
            previous = ModelRegistry(one, pool, metrics, previous=previous)
        except Exception as e:  # noqa: BLE001 - whatever building fails with is the entry's problem, reported
            problems.append(ConfigError(file, where, f"model {m.name!r} cannot be built: {e}"))
    return problems


async def probe_models(config: GatewayConfig, timeout_s: float = PROBE_TIMEOUT_S) -> list[ConfigError]:
    """Ask each entry's Triton, at every static url, for its model (config check and readiness)."""
    file = config.source or Path("model_config.json")
    pool, metrics = TritonClientPool(), Metrics()

    async def one(where: str, m: LLMModel | EmbeddingModel | RerankModel, url: str) -> ConfigError | None:
        entry = m.model_copy(update={"url": url})  # this replica alone
        backend: LLMBackend | EncoderBackend = (
            llm_backend(entry, pool, metrics, None)[0] if isinstance(entry, LLMModel)
            else encoder_backend(entry, pool, metrics)[0])
        at = f"{url}: Triton model {entry.triton_name!r}"
        try:
            async with asyncio.timeout(timeout_s):
                await backend.check()
        except GatewayError as e:
            return ConfigError(file, f"{where}.url", f"{at}: {e.message}")
        except TimeoutError:
            return ConfigError(file, f"{where}.url", f"{at}: Triton did not answer within {timeout_s:g} s")
        if not await model_ready(pool, entry.transport, url, entry.triton_name, entry.triton_version):
            return ConfigError(file, f"{where}.url", f"{at}: not ready")
        return None

    try:
        checks = [one(where, m, url) for where, m in config.entries() for url in m.urls
                  if not url.startswith(DNS_SCHEME)]
        found = await asyncio.gather(*checks)
    finally:
        await pool.close()
    return [p for p in found if p is not None]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="openai-api check-config",
                                description="Check a model config: every problem, one line each; exit 1 if any.")
    p.add_argument("file", type=Path, metavar="FILE", help="the model config JSON")
    p.add_argument("--probe", action="store_true",
                   help="also ask each model's Triton (every static url): config matches the entry, model ready")
    p.add_argument("--timeout", type=float, default=PROBE_TIMEOUT_S, metavar="SECONDS",
                   help=f"deadline of each probe (default {PROBE_TIMEOUT_S:g})")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # Building models logs what it detects (parser families); only what is wrong belongs in this output.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config, problems = check_config(args.file)
    checked = "read"
    if config is not None:
        flawed = {p.field.split(".")[0] for p in problems}
        problems += build_models(config, flawed)
        checked = "read and built"
        if args.probe:
            problems += asyncio.run(probe_models(config, args.timeout))
            checked = "read, built and probed on Triton"
    out = sys.stdout
    for p in problems:
        out.write(f"{p}\n")
    models = len(config.all_models()) if config is not None else 0
    if problems:
        out.write(f"{args.file}: {len(problems)} problem{'s' if len(problems) != 1 else ''}\n")
        return 1
    out.write(f"{args.file}: OK ({models} model{'s' if models != 1 else ''} {checked})\n")
    return 0
