"""Chat templates: Hugging Face-compatible Jinja templates rendered in a sandbox.

Templates may come from a model's tokenizer folder, i.e. from whoever published the model, so they
are treated as untrusted code: they run in an `ImmutableSandboxedEnvironment`, see only plain JSON
data (never the gateway's own objects), and every failure surfaces as `TemplateError` whose
message is safe to show to an API client.

The environment mirrors `transformers.utils.chat_template_utils` (trim_blocks, lstrip_blocks,
loop controls, `raise_exception`, `strftime_now`, an unescaped `tojson`, a dunder-proof
`namespace`) so a template renders here exactly as `tokenizer.apply_chat_template` renders it.

Every render has a budget (`RenderLimits`: seconds and characters), because a template (or the data a
client sends through it) can otherwise hang or bloat the process: nested `range` loops, `'a' * N`,
`tojson(indent=N)`, a string doubled in a loop. The sandbox checks the budget where templates spend:
each piece of output, each call, attribute and item access, each `range` step, every `* ** % +`
operator (sizes are checked *before* the operation allocates), every filter result and every value
stored in a `namespace`. A loop with none of those in its body (an empty nested loop over data) is
stopped by the caller instead: renders of untrusted size run on `text.workers.CPUWorkers`, which
interrupts a job past its time budget. `ChatTemplate.bounded` says whether a template's own structure
keeps its work proportional to its input (no `range`, no repetition operators, no macros, loops nested
at most twice), which is what lets a small request render inline on the event loop.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.meta
import jinja2.utils
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment

from openai_api.text.workers import JobInterrupted

logger = logging.getLogger(__name__)

__all__ = ["ChatTemplate", "RenderLimits", "TemplateBudgetError", "TemplateError"]


class TemplateError(Exception):
    """A chat template could not be compiled or rendered.

    Raised for syntax errors, `raise_exception(...)` calls inside a template, sandbox
    violations and any other render-time failure. The message is safe to return to clients:
    it names the template and the problem but never includes interpreter internals.
    """


class TemplateBudgetError(TemplateError):
    """A render ran past its `RenderLimits` (time or size)."""


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """What one render may spend: wall seconds, and characters in any value it builds or outputs."""

    max_seconds: float = 10.0
    max_chars: int = 32 * 1024 * 1024


class _OverBudget(jinja2.exceptions.TemplateError):
    pass


class _Budget:
    __slots__ = ("deadline", "limits")

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _OverBudget(f"it took longer than {self.limits.max_seconds:g} s")

    def size(self, n: int) -> None:
        if n > self.limits.max_chars:
            raise _OverBudget(f"it built a value of {n} characters, more than the limit of {self.limits.max_chars}")


_state = threading.local()
_DEFAULT_LIMITS = RenderLimits()


def _budget() -> _Budget:
    budget: _Budget | None = getattr(_state, "budget", None)
    if budget is None:  # a render outside ChatTemplate.render (never in the gateway): default limits
        budget = _state.budget = _Budget(_DEFAULT_LIMITS)
    return budget


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple | dict | bytes) else 0


# A width or precision in a %-format or str.format spec ("%99999999d", "{:>99999999}").
_FORMAT_WIDTH = re.compile(r"(\d{5,})")


def _format_width(fmt: Any) -> int:
    if not isinstance(fmt, str):
        return 0
    return max((int(w) for w in _FORMAT_WIDTH.findall(fmt)), default=0)


class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the render budget checked at every place a template can spend it."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.tick()
        if operator == "+" and type(left) is str and type(right) is str:
            # Most of a chat template's operations (~100 a message): the sum's size is known before it is
            # built, and Jinja's own `+` is `operator.add`. A render of an agent turn of 77 messages spent
            # ~60% of its time in the general path below.
            budget.size(len(left) + len(right))
            return left + right
        if operator == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(times, int) and not isinstance(times, bool):
                budget.size(_length(seq) * max(times, 0))
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0:
                budget.size(max(abs(left).bit_length(), 1) * right // 8)  # the result's size in bytes
        elif operator == "%":
            budget.size(_format_width(left))
        elif operator == "+":
            budget.size(_length(left) + _length(right))
        result = super().call_binop(context, operator, left, right)
        budget.size(_length(result))
        return result

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool):
                budget.size(a)  # center(10**9), ljust, zfill, lipsum(n), expandtabs: sizes asked for
            else:
                budget.size(_length(a) + _format_width(a))
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str) and getattr(__obj, "__name__", "") == "expandtabs" and args:
            budget.size(owner.count("\t") * int(args[0]) if isinstance(args[0], int) else 0)
        result = super().call(__context, __obj, *args, **kwargs)
        budget.size(_length(result))
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget().tick()
        return super().getitem(obj, argument)


def _budgeted_filter(fn: Any) -> Any:
    """A filter with the budget checked before (size arguments) and after (the result's size)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        for a in (*args[1:], *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool):
                budget.size(a)
        if fn is _jinja_indent and args:  # do_indent(s, width=4, ...): every line gets `width` more
            width = kwargs.get("width", args[1] if len(args) > 1 else 4)
            budget.size((str(args[0]).count("\n") + 1) * (width if isinstance(width, int) else _length(width)))
        result = fn(*args, **kwargs)
        budget.size(_length(result))
        return result

    return wrapper


def _budgeted_range(*args: int) -> Iterator[int]:
    """Jinja's sandboxed `range` (at most MAX_RANGE items), checking the budget as it goes."""
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise OverflowError(f"Range too big. The sandbox blocks ranges larger than MAX_RANGE ({MAX_RANGE}).")
    budget = _budget()
    for i in rng:
        if not i & 1023:
            budget.tick()
        yield i


class _RaisedByTemplate(jinja2.exceptions.TemplateError):
    # Distinguishes a template's own raise_exception() from Jinja failures, so its message is passed
    # through verbatim (templates use it to explain what the conversation got wrong).
    pass


def _raise_exception(message: str) -> NoReturn:
    raise _RaisedByTemplate(str(message))


# Deeper than this, `tojson(indent=N)` only pads (N spaces per level and line): a size attack, not a format.
_MAX_JSON_INDENT = 16
_jinja_indent = jinja2.filters.do_indent


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's builtin tojson HTML-escapes <, >, & and ', which would corrupt prompts; HF overrides it
    # the same way, and templates rely on its indent/separators options.
    if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int | str)
                               or (indent if isinstance(indent, int) else len(indent)) > _MAX_JSON_INDENT):
        raise _OverBudget(f"tojson indent must be at most {_MAX_JSON_INDENT}")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    # The builtin `dict` type would expose its classmethods and attributes; this stand-in only builds dicts.
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    # Jinja's Namespace accepts any attribute name; underscore names could shadow its internals, so they
    # are refused at creation and assignment, as HF does.
    # `self` is positional-only so that `namespace(self=1)` still works, as with Jinja's Namespace.
    def __init__(self, /, *args: Any, **kwargs: Any) -> None:
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        budget = _budget()
        budget.tick()
        budget.size(_length(value))  # a namespace carries values across loop iterations: a string doubled there
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace: {name!r}")


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    # One shared environment: rendering is thread-safe and the globals are stateless.
    env = _BudgetedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _budgeted_filter(f) for name, f in env.filters.items()}
    env.globals["range"] = _budgeted_range
    env.globals.pop("lipsum", None)  # random filler text of any size; no chat template uses it
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _plain(value: Any) -> Any:
    """Deep-copy `value` into plain JSON types so the template can't reach methods of richer objects.

    Subclasses of str/int/float (enums, numpy scalars, ...) are reduced to their base type; anything
    that is not JSON-like becomes an inert placeholder naming its type. The copy also means templates
    never observe (or, via the tag used by continue_final_message, alter) the caller's messages.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return _plain(model_dump())
    return f"<{type(value).__name__}>"


def _describe(exc: BaseException) -> str:
    # Only the exception's own message: tracebacks and reprs of internals stay in the server log.
    text = str(exc).strip()
    return text or type(exc).__name__


# Loops nested deeper than this make a template's work grow as a power of its input.
_MAX_LOOP_DEPTH = 2


def _loop_depth(node: jinja2.nodes.Node) -> int:
    inner = max((_loop_depth(child) for child in node.iter_child_nodes()), default=0)
    return inner + 1 if isinstance(node, jinja2.nodes.For) else inner


def _structurally_bounded(ast: jinja2.nodes.Template) -> bool:
    """Whether the template's own structure keeps its work proportional to its input: no `range` (loops
    of a length the template picks), no repetition or power operators, no macros (recursion), and loops
    nested at most `_MAX_LOOP_DEPTH` deep. The bundled and usual model templates are; such a template
    with a small input is cheap enough to render on the event loop."""
    if any(isinstance(n, jinja2.nodes.Mul | jinja2.nodes.Pow | jinja2.nodes.Macro
                      | jinja2.nodes.CallBlock) for n in ast.find_all(jinja2.nodes.Node)):
        return False
    if any(n.name == "range" for n in ast.find_all(jinja2.nodes.Name)):
        return False
    return _loop_depth(ast) <= _MAX_LOOP_DEPTH


def _parents(ast: jinja2.nodes.Template) -> dict[int, jinja2.nodes.Node]:
    """Each node's parent, by the child's id (Jinja's AST has no parent links)."""
    parents: dict[int, jinja2.nodes.Node] = {}
    for node in ast.find_all(jinja2.nodes.Node):
        for child in node.iter_child_nodes():
            parents[id(child)] = node
    return parents


def _key_access(node: jinja2.nodes.Node, key: str) -> bool:
    """`x.key`, `x['key']` or `x.get('key')`."""
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == key
    if isinstance(node, jinja2.nodes.Getitem):
        return isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Call) and isinstance(node.node, jinja2.nodes.Getattr):
        return (node.node.attr == "get" and bool(node.args) and isinstance(node.args[0], jinja2.nodes.Const)
                and node.args[0].value == key)
    return False


def _uses_of(ast: jinja2.nodes.Template, key: str) -> list[jinja2.nodes.Node]:
    """Every expression that reads a message's `key` field: the accesses themselves, and the loads of
    names that a `set` or a macro parameter bound to such an access (one level of aliasing, which is as
    deep as real templates go: `{% set args = tool_call.arguments %}`, `visible_text(m.content)`)."""
    found = [n for n in ast.find_all(jinja2.nodes.Node) if _key_access(n, key)]
    aliases = {a.target.name for a in ast.find_all(jinja2.nodes.Assign)
               if isinstance(a.target, jinja2.nodes.Name) and any(a.node is n for n in found)}
    for macro in ast.find_all(jinja2.nodes.Macro):
        params = [p.name for p in macro.args]
        for call in ast.find_all(jinja2.nodes.Call):
            if isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name:
                aliases.update(params[i] for i, arg in enumerate(call.args[:len(params)])
                               if any(arg is n for n in found))
    names = [n for n in ast.find_all(jinja2.nodes.Name) if n.ctx == "load" and n.name in aliases]
    return found + names


def _reads_arguments_as_text(ast: jinja2.nodes.Template) -> bool:
    """Whether the template wants an earlier call's `function.arguments` as OpenAI's JSON string.

    transformers' documentation and vLLM hand templates a dict (vLLM parses the string for every template),
    and a template that applies `tojson`, `items` or a `for` loop to it needs one. The string is kept only
    where the template is written for it: it tests the value's type (`arguments is string`: it prints a
    string as it is, which keeps the model's own text), or it only concatenates or prints the value raw
    (DeepSeek-V3.1's `'...' + tool['function']['arguments']`), which a dict would turn into Python syntax
    or a render error.
    """
    parents = _parents(ast)
    tests = text = structured = False
    for use in _uses_of(ast, "arguments"):
        parent = parents.get(id(use))
        if isinstance(parent, jinja2.nodes.Test) and parent.name in ("string", "mapping"):
            tests = True
        elif isinstance(parent, jinja2.nodes.Add | jinja2.nodes.Concat | jinja2.nodes.Output):
            text = True
        elif isinstance(parent, jinja2.nodes.Filter) and parent.name in ("tojson", "items", "dictsort"):
            structured = True
        elif isinstance(parent, jinja2.nodes.Getattr) and parent.attr in ("items", "keys", "values"):
            structured = True
        elif isinstance(parent, jinja2.nodes.For) and parent.iter is use:
            structured = True
    return tests or (text and not structured)


def _reads_content_parts(ast: jinja2.nodes.Template) -> bool:
    """Whether the template reads a message's `content` as a list of parts (it loops over it, or filters it
    with `selectattr`/`map`), as vLLM detects its "openai" content format. Such a template gets the text
    parts as sent; any other gets them joined into one string, which is all it can print."""
    parents = _parents(ast)
    for use in _uses_of(ast, "content"):
        parent = parents.get(id(use))
        if isinstance(parent, jinja2.nodes.For) and parent.iter is use:
            return True
        if isinstance(parent, jinja2.nodes.Filter) and parent.name in ("selectattr", "map", "rejectattr"):
            return True
    return False


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
        env = _environment()
        try:
            ast = env.parse(source, name=self.name)
            self._template = env.from_string(ast)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template syntax error in {self.name}, line {exc.lineno}: {exc.message}") from exc
        # Only names read before being set count: `{% set tools = none %}` after `{% if tools is
        # defined %}` still reads the caller's `tools`.
        self._undeclared = frozenset(jinja2.meta.find_undeclared_variables(ast))
        self.bounded = _structurally_bounded(ast)
        # How earlier calls' arguments and content parts reach this template (see the two functions).
        self.arguments_as_text = _reads_arguments_as_text(ast)
        self.content_as_parts = _reads_content_parts(ast)

    @classmethod
    def from_file(cls, path: Path) -> ChatTemplate:
        """Load and compile a `.jinja` file. Raises TemplateError if unreadable or invalid."""
        path = Path(path)
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read chat template {path}: {_describe(exc)}") from exc
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
            raise TemplateError(f"cannot read {config_file}: {_describe(exc)}") from exc
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
        chat = _plain(list(messages))
        extra = _plain(kwargs)
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

        budget = _Budget(limits or _DEFAULT_LIMITS)
        previous = getattr(_state, "budget", None)
        _state.budget = budget
        try:
            pieces = []
            size = 0
            for piece in self._template.generate(
                    messages=chat, tools=_plain(tools), add_generation_prompt=add_generation_prompt,
                    bos_token=bos_token, eos_token=eos_token, **extra):
                size += len(piece)
                budget.size(size)
                budget.tick()
                pieces.append(piece)
            rendered = "".join(pieces)
        except _OverBudget as exc:
            raise TemplateBudgetError(f"chat template {self.name} exceeded its render budget: {exc}") from exc
        except JobInterrupted:
            raise  # the caller's own time budget (text.workers): not the template's error to phrase
        except _RaisedByTemplate as exc:
            raise TemplateError(_describe(exc)) from exc
        except jinja2.exceptions.SecurityError as exc:
            logger.warning("chat template %s attempted a sandbox violation: %s", self.name, exc)
            raise TemplateError(f"chat template {self.name} attempted a forbidden operation") from exc
        # Any failure inside untrusted template code is the template's fault, never the gateway's.
        except MemoryError as exc:
            raise TemplateBudgetError(f"chat template {self.name} ran out of memory") from exc
        except Exception as exc:
            raise TemplateError(f"chat template {self.name} failed to render: {_describe(exc)}") from exc
        finally:
            _state.budget = previous

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
