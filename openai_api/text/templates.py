"""Chat templates: Hugging Face-compatible Jinja templates, compiled once and rendered in a sandbox.

`ChatTemplate` is a model's template: loaded from a file, a string or a tokenizer folder, compiled once, and
rendered (concurrently, from any thread) to a prompt, `continue_final_message` included. It renders in the
budgeted sandbox of `text.sandbox` (untrusted code: plain JSON data in, `TemplateError` with a message safe to
show a client out, `RenderLimits` on time and size), and reads what its own source says about how it takes its
input once, at compile time (`text.template_ast`): `bounded` (its structure keeps its work proportional to its
input, which is what lets a small request render inline on the event loop), `arguments_as_text`,
`content_as_parts`.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta

from openai_api.text.sandbox import (
    BoundBudget,
    OverBudget,
    RaisedByTemplate,
    RenderLimits,
    TemplateBudgetError,
    TemplateError,
    describe,
    environment,
    plain,
)
from openai_api.text.template_ast import reads_arguments_as_text, reads_content_parts, structurally_bounded
from openai_api.text.workers import JobInterrupted

logger = logging.getLogger(__name__)

__all__ = ["ChatTemplate", "RenderLimits", "TemplateBudgetError", "TemplateError"]


class ChatTemplate:
    """A compiled chat template.

    Compilation happens once, in the constructor; `render` may then be called concurrently from
    any number of threads. Templates follow the Hugging Face conventions: they receive `messages`,
    `add_generation_prompt`, `tools`, `bos_token`, `eos_token` and any extra keyword arguments.
    """

    # Appended to the final message's content when continuing it, then located in the output; the random
    # suffix is fixed per process so user text can't plausibly collide with it. The trailing space detects
    # templates that strip message content (see render()).
    _CONTINUE_TAG = f"CONTINUE_FINAL_MESSAGE_{uuid.uuid4().hex} "

    def __init__(self, source: str, *, name: str | None = None) -> None:
        """Compile `source`; `name` (e.g. the file path) is used in error messages.

        Raises TemplateError for a syntax error, naming the template and line.
        """
        self.source = source
        self.name = name or "<chat template>"
        env = environment()
        try:
            ast = env.parse(source, name=self.name)
            self._template = env.from_string(ast)
            # A template's globals are a ChainMap over the environment's (set once, before any template is
            # compiled); every render copied it key by key in Python and iterated it again (jinja's
            # `new_context`), ~10 us of a short chat's ~1 ms. One flat dict, made once, is copied in C.
            self._template.globals = dict(self._template.globals)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template syntax error in {self.name}, line {exc.lineno}: {exc.message}") from exc
        # Only names read before being set count: `{% set tools = none %}` after `{% if tools is
        # defined %}` still reads the caller's `tools`.
        self._undeclared = frozenset(jinja2.meta.find_undeclared_variables(ast))
        self.bounded = structurally_bounded(ast)
        # How earlier calls' arguments and content parts reach this template (see the two functions).
        self.arguments_as_text = reads_arguments_as_text(ast)
        self.content_as_parts = reads_content_parts(ast)

    @classmethod
    def from_file(cls, path: Path) -> ChatTemplate:
        """Load and compile a `.jinja` file. Raises TemplateError if unreadable or invalid."""
        path = Path(path)
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read chat template {path}: {describe(exc)}") from exc
        return cls(source, name=str(path))

    @classmethod
    def from_string(cls, source: str) -> ChatTemplate:
        """Compile a template given as text. Raises TemplateError if invalid."""
        return cls(source)

    @classmethod
    def from_tokenizer_dir(cls, folder: Path) -> ChatTemplate | None:
        """Load the template a Hugging Face tokenizer folder ships, or None if it has none.

        Looks for `chat_template.jinja` first (the newer layout), then the `chat_template` key of
        `tokenizer_config.json`, which is either a string or a list of `{name, template}` entries of
        which the one named "default" is used. Raises TemplateError if a template exists but is
        invalid or the config file is unreadable.
        """
        folder = Path(folder)
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            return cls.from_file(jinja_file)
        config_file = folder / "tokenizer_config.json"
        if not config_file.is_file():
            return None
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TemplateError(f"cannot read {config_file}: {describe(exc)}") from exc
        raw = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(raw, list):
            named = {entry.get("name"): entry.get("template") for entry in raw if isinstance(entry, dict)}
            raw = named.get("default")
            if raw is None:
                logger.warning("%s lists named chat templates but none called 'default'; ignoring them",
                               config_file)
        if not isinstance(raw, str) or not raw:
            return None
        return cls(raw, name=f"{config_file}:chat_template")

    def reads(self, name: str) -> bool:
        """Whether the template reads the top-level variable `name` (a keyword argument of `render`), e.g.
        `enable_thinking` or `reasoning_effort`: what a request may set through it."""
        return name in self._undeclared

    @functools.cached_property
    def renders_system_anywhere(self) -> bool:
        """Whether a system message after the first turn is rendered where it stands.

        Decided once, by rendering a probe conversation (system, user, system, assistant, system, user)
        with two marked system messages: True when it renders and both marks appear in order around the
        assistant turn. A template that raises (roles must alternate, "system message must be first"),
        drops them or hoists them to the top is False: the caller then folds such messages into the first
        system message (`services.chat.place_system_messages`)."""
        marks = [f"SYSTEM_PROBE_{uuid.uuid4().hex}" for _ in range(2)]
        texts = ["You are helpful.", "Hello.", marks[0], "Hi there.", marks[1], "Thanks."]
        roles = ["system", "user", "system", "assistant", "system", "user"]
        probe = [{"role": r, "content": [{"type": "text", "text": t}] if self.content_as_parts else t}
                 for r, t in zip(roles, texts, strict=True)]
        try:
            out = self.render(probe, add_generation_prompt=True)
        except TemplateError:
            return False
        first, answer, second = out.find(marks[0]), out.find("Hi there."), out.find(marks[1])
        return 0 <= first < answer < second

    @property
    def uses_tools(self) -> bool:
        """Whether the template reads the `tools` variable.

        When False, passing `tools` to `render` has no effect, so the caller must describe the tools
        to the model itself (e.g. in a system message).
        """
        return "tools" in self._undeclared

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, continue_final_message: bool = False,
               bos_token: str = "", eos_token: str = "", limits: RenderLimits | None = None, **kwargs: Any) -> str:
        """Render a conversation to the prompt text.

        `messages` are OpenAI-style dicts (`role`, `content`, optionally `tool_calls`, `name`,
        `tool_call_id`); content is expected to be a string (or None for tool-call-only assistant
        turns). `tools` is passed as given (OpenAI `{"type": "function", "function": ...}` entries).

        With `continue_final_message=True` the final message must be an assistant message; the
        output is cut right after its content (no end-of-turn marker, no generation prompt) so the
        model continues that text. Raises TemplateError on any failure, TemplateBudgetError when the
        render spends more than `limits` (default `RenderLimits()`) allows.
        """
        chat = plain(list(messages))
        extra = plain(kwargs)
        tag = self._CONTINUE_TAG
        final_content = ""
        if continue_final_message:
            if not chat:
                raise TemplateError("continue_final_message requires at least one message")
            final = chat[-1]
            if not isinstance(final, dict) or final.get("role") != "assistant":
                raise TemplateError(
                    "continue_final_message requires the final message to be from the assistant")
            content = final.get("content")
            if not isinstance(content, str):
                raise TemplateError("continue_final_message requires the final message to have text content")
            final_content = content
            final["content"] = final_content + tag
            add_generation_prompt = False

        try:
            with BoundBudget(limits) as budget:
                pieces = []
                size = 0
                for piece in self._template.generate(
                        messages=chat, tools=plain(tools), add_generation_prompt=add_generation_prompt,
                        bos_token=bos_token, eos_token=eos_token, **extra):
                    size += len(piece)
                    budget.size(size)
                    budget.tick()
                    pieces.append(piece)
                rendered = "".join(pieces)
        except OverBudget as exc:
            raise TemplateBudgetError(f"chat template {self.name} exceeded its render budget: {exc}") from exc
        except JobInterrupted:
            raise  # the caller's own time budget (text.workers): not the template's error to phrase
        except RaisedByTemplate as exc:
            raise TemplateError(describe(exc)) from exc
        except jinja2.exceptions.SecurityError as exc:
            logger.warning("chat template %s attempted a sandbox violation: %s", self.name, exc)
            raise TemplateError(f"chat template {self.name} attempted a forbidden operation") from exc
        # Any failure inside untrusted template code is the template's fault, never the gateway's.
        except MemoryError as exc:
            raise TemplateBudgetError(f"chat template {self.name} ran out of memory") from exc
        except Exception as exc:
            raise TemplateError(f"chat template {self.name} failed to render: {describe(exc)}") from exc

        if not continue_final_message:
            return rendered
        # Locate the tag rather than the content itself: the content may legitimately also appear
        # earlier (or be empty), while the tag marks exactly where the final message ends.
        stripped_tag = tag.strip()
        loc = rendered.rfind(stripped_tag)
        if loc < 0 or final_content.strip() not in rendered[:loc]:
            raise TemplateError(
                "continue_final_message is set but the template does not render the final message's content")
        if rendered[loc:loc + len(tag)] == tag:
            return rendered[:loc]
        # The template stripped trailing whitespace off the content (taking the tag's space with it);
        # strip the content the same way so the prefix matches what the template would produce.
        return rendered[:loc].rstrip()
