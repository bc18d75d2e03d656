"""The files a config names, found and checked when it loads: the package data the gateway ships (the bundled
config and chat templates), paths resolved against the config's own folder, a chat template named by its bare file
name, and each entry's tokenizer folder, chat template and token-id vocabulary, built once at load
(`_resolve_files`) so that a missing or broken one stops start-up with one line. Apart from the loader, which reads
the config file itself: this is what the file points to on disk."""

from __future__ import annotations

import os
from pathlib import Path

from openai_api.config.entries import EmbeddingModel, LLMModel, RerankModel
from openai_api.config.problems import _Problems
from openai_api.text.templates import ChatTemplate, TemplateError

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
# Package data (pyproject's package-data), so that `pip install .` carries them and an installed copy finds
# them where a checkout does. The default config is where the seed system kept it (openai_api/openai_api/);
# its model folders are the reference models scripts/setup.sh prepares in the checkout's models/.
BUNDLED_CONFIG = PACKAGE_ROOT / "model_config.json"
BUNDLED_TEMPLATES = PACKAGE_ROOT / "chat_templates"


def _resolve(base: Path, value: Path) -> Path:
    value = Path(os.path.expandvars(os.path.expanduser(str(value))))
    return value if value.is_absolute() else (base / value).resolve()


def _resolve_template(base: Path, value: Path) -> Path | None:
    """A template is looked up next to the config, then in its chat_templates/, then in the bundled set,
    because the seed names templates by bare file name (`"chat_template": "chatglm2.jinja"`)."""
    candidates = [_resolve(base, value)]
    if not value.is_absolute():
        candidates += [base / "chat_templates" / value, BUNDLED_TEMPLATES / value]
    return next((c.resolve() for c in candidates if c.is_file()), None)


def _resolve_files(path: Path, base: Path, where: str, m: LLMModel | EmbeddingModel | RerankModel,
                   problems: _Problems) -> None:
    """One entry's files made absolute and checked: its tokenizer folder, and what is built from files at
    start-up (the chat template compiled, the cl100k_base vocabulary loaded), so that each stops start-up with
    one line instead of failing later."""
    m.path = _resolve(base, m.path)
    if not m.path.is_dir():
        problems.add(path, f"{where}.path", f"tokenizer folder not found: {m.path}")
    elif not (m.path / "tokenizer.json").is_file():
        problems.add(path, f"{where}.path", f"no tokenizer.json in {m.path}")
    if isinstance(m, EmbeddingModel) and m.token_ids == "cl100k_base" and not m.accept_token_ids:
        from openai_api.text.cl100k import VocabularyUnavailable, cl100k

        try:
            cl100k()
        except VocabularyUnavailable as e:
            problems.add(path, f"{where}.token_ids", f"{e}; or set token_ids to 'refuse' or 'accept_token_ids'")
    if not isinstance(m, LLMModel):
        return
    if m.chat_template is not None:
        found = _resolve_template(base, m.chat_template)
        if found is None:
            problems.add(path, f"{where}.chat_template", f"template file not found: {m.chat_template}")
            return
        m.chat_template = found
    elif not m.path.is_dir():
        return  # the tokenizer folder's template: its folder is reported already
    try:
        if m.chat_template is not None:
            ChatTemplate.from_file(m.chat_template)
        else:
            ChatTemplate.from_tokenizer_dir(m.path)
    except TemplateError as e:
        problems.add(path, f"{where}.chat_template", str(e))
