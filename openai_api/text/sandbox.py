"""The sandbox chat templates render in: Hugging Face-compatible Jinja, with a budget.

Templates may come from a model's tokenizer folder, i.e. from whoever published the model, so they
are treated as untrusted code: they run in an `ImmutableSandboxedEnvironment`, see only plain JSON
data (`plain`: never the gateway's own objects), and every failure surfaces as `TemplateError` whose
message is safe to show to an API client.

The environment (`environment`) mirrors `transformers.utils.chat_template_utils` (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, an unescaped `tojson`, a dunder-proof
`namespace`) so a template renders here exactly as `tokenizer.apply_chat_template` renders it.

Every render has a budget (`RenderLimits`: seconds and characters; `BoundBudget` binds one to the rendering
thread), because a template (or the data a client sends through it) can otherwise hang or bloat the
process: nested `range` loops, `'a' * N`, `tojson(indent=N)`, a string doubled in a loop. The sandbox checks
the budget where templates spend: each piece of output, each call, attribute and item access, each `range`
step, every `* ** % +` operator (sizes are checked *before* the operation allocates), every filter result
and every value stored in a `namespace`. A loop with none of those in its body (an empty nested loop over
data) is stopped by the caller instead: renders of untrusted size run on `text.workers.CPUWorkers`, which
interrupts a job past its time budget.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.utils
from jinja2.runtime import LoopContext
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment


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


class OverBudget(jinja2.exceptions.TemplateError):
    """A render past its budget, raised inside Jinja (`ChatTemplate.render` reports it as TemplateBudgetError)."""


class Budget:
    """What one render may still spend: its deadline and its cap on the characters of any value."""

    __slots__ = ("deadline", "limits")

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise OverBudget(f"it took longer than {self.limits.max_seconds:g} s")

    def size(self, n: int) -> None:
        if n > self.limits.max_chars:
            raise OverBudget(f"it built a value of {n} characters, more than the limit of {self.limits.max_chars}")


_state = threading.local()
_DEFAULT_LIMITS = RenderLimits()


def _budget() -> Budget:
    budget: Budget | None = getattr(_state, "budget", None)
    if budget is None:  # a render outside ChatTemplate.render (never in the gateway): default limits
        budget = _state.budget = Budget(_DEFAULT_LIMITS)
    return budget


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple | dict | bytes) else 0


# A width or precision in a %-format or str.format spec ("%99999999d", "{:>99999999}").
_FORMAT_WIDTH = re.compile(r"(\d{5,})")


def _format_width(fmt: Any) -> int:
    if not isinstance(fmt, str):
        return 0
    return max((int(w) for w in _FORMAT_WIDTH.findall(fmt)), default=0)


# The data attributes of a `for` loop's `loop` variable.
_LOOP_FIELDS = frozenset({"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth",
                          "depth0", "previtem", "nextitem"})


class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the render budget checked at every place a template can spend it."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        if operator == "+" and type(left) is str and type(right) is str:
            # Most of a chat template's operations (~100 a message): the sum's size is known before it is
            # built, and Jinja's own `+` is `operator.add`. A render of an agent turn of 77 messages spent
            # ~60% of its time in the general path below. `tick` and `size`, inline: they only raise.
            if time.monotonic() > budget.deadline:
                budget.tick()
            size = len(left) + len(right)
            if size > budget.limits.max_chars:
                budget.size(size)
            return left + right
        budget.tick()
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
        if type(obj) is LoopContext and attribute in _LOOP_FIELDS:
            # `loop.first` and its kin, once a message in most templates: public data of Jinja's own loop,
            # which the sandbox's checks (not private, not internal, not a mutating method) always pass.
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                return super().getattr(obj, attribute)
            fmt = self.wrap_str_format(value)
            return value if fmt is None else fmt
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


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    # Distinguishes a template's own raise_exception() from Jinja failures, so its message is passed
    # through verbatim (templates use it to explain what the conversation got wrong).
    pass


def _raise_exception(message: str) -> NoReturn:
    raise RaisedByTemplate(str(message))


# Deeper than this, `tojson(indent=N)` only pads (N spaces per level and line): a size attack, not a format.
_MAX_JSON_INDENT = 16
_jinja_indent = jinja2.filters.do_indent


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's builtin tojson HTML-escapes <, >, & and ', which would corrupt prompts; HF overrides it
    # the same way, and templates rely on its indent/separators options.
    if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int | str)
                               or (indent if isinstance(indent, int) else len(indent)) > _MAX_JSON_INDENT):
        raise OverBudget(f"tojson indent must be at most {_MAX_JSON_INDENT}")
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
def environment() -> ImmutableSandboxedEnvironment:
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


_PLAIN = frozenset({str, int, float, bool, type(None)})


def plain(value: Any) -> Any:
    """Deep-copy `value` into plain JSON types so the template can't reach methods of richer objects.

    Subclasses of str/int/float (enums, numpy scalars, ...) are reduced to their base type; anything
    that is not JSON-like becomes an inert placeholder naming its type. The copy also means templates
    never observe (or, via the tag used by continue_final_message, alter) the caller's messages.
    """
    kind = type(value)
    if kind in _PLAIN:
        return value
    # A dict or list of plain JSON (nearly every message), its scalars copied without a call each.
    if kind is dict:
        return {k if type(k) is str else plain(k): v if type(v) in _PLAIN else plain(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _PLAIN else plain(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return plain(model_dump())
    return f"<{type(value).__name__}>"


def describe(exc: BaseException) -> str:
    # Only the exception's own message: tracebacks and reprs of internals stay in the server log.
    text = str(exc).strip()
    return text or type(exc).__name__


class BoundBudget:
    """The budget of one render (`limits`, else the defaults), bound to this thread while it renders. A class
    rather than a generator: it runs once per render, on the event loop for small ones."""

    __slots__ = ("budget", "previous")

    def __init__(self, limits: RenderLimits | None) -> None:
        self.budget = Budget(limits or _DEFAULT_LIMITS)
        self.previous: Budget | None = None

    def __enter__(self) -> Budget:
        self.previous = getattr(_state, "budget", None)
        _state.budget = self.budget
        return self.budget

    def __exit__(self, *exc: object) -> None:
        _state.budget = self.previous
