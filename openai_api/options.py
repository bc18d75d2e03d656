"""How a setting appears outside the code: its `Option`, and the flag, variable and docs row derived from it.

Each field of `settings.Settings` carries an `Option`; for a settings model this derives its flag
(`--field-name`) and environment variable (`OPENAI_API_FIELD`), the argparse flags in their groups, a value
read from the environment's text, and the docs' table of flags. `openai_api.settings` declares the settings
themselves and reads them (flag over environment over default).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

ENV_PREFIX = "OPENAI_API_"


@dataclass(frozen=True, slots=True)
class Option:
    """How a setting appears outside the code. `flag` defaults to `--field-name`; `unit` converts the flag's
    and the environment's value into the field's (1000 ms -> 1 s: 0.001); `env` overrides the variable's
    name; `negate` makes a boolean that defaults to true a `--no-...` flag; `shown_default` is what the docs
    say when the default is computed; `parse` turns the flag's and the environment's text into the value when
    the field's type alone cannot (a word such as `auto`), raising ValueError with the reason; `old_env` is a
    former name of the variable, still read (in the same unit) for one release, with a warning."""

    help: str
    group: str = "server"
    flag: str | None = None
    metavar: str | None = None
    unit: float = 1.0
    env: str | None = None
    negate: bool = False
    shown_default: str | None = None
    parse: Callable[[str], Any] | None = None
    old_env: str | None = None


GROUPS = {"server": "server", "triton": "embedded Triton", "limits": "limits, overload and timeouts",
          "keys": "keys and quotas", "streaming": "streaming", "images": "images in chat", "logging": "logging",
          "observability": "metrics, status page and docs"}


def from_env_text(model: type[BaseModel], name: str, opt: Option, raw: str) -> Any:
    """The value of `model`'s field `name` from its environment variable's text (pydantic converts the rest)."""
    if model.model_fields[name].annotation is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if opt.parse is not None:
        try:
            return opt.parse(raw)
        except ValueError as e:
            raise ValueError(f"{env_name(name, opt)}: {e}") from None
    if opt.unit != 1.0:
        try:
            return float(raw) * opt.unit
        except ValueError:
            raise ValueError(f"{env_name(name, opt)}: not a number: {raw!r}") from None
    return raw  # pydantic converts and validates (int, float, Path, Literal)


def field_options(model: type[BaseModel]) -> list[tuple[str, Option]]:
    """(field name, Option) of every field of `model` that carries one, in declaration order."""
    out = []
    for name, field in model.model_fields.items():
        opt = next((m for m in field.metadata if isinstance(m, Option)), None)
        if opt is not None:
            out.append((name, opt))
    return out


def flag_of(name: str, opt: Option | None) -> str:
    return (opt.flag if opt and opt.flag else "--" + name.replace("_", "-"))


def env_name(name: str, opt: Option | None) -> str:
    return opt.env if opt and opt.env else ENV_PREFIX + name.upper()


def _base_type(annotation: Any) -> Any:
    """`int` for `int | None`: the type a flag's text converts to."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def _shown_default(model: type[BaseModel], name: str, opt: Option) -> str:
    if opt.shown_default is not None:
        return opt.shown_default
    field = model.model_fields[name]
    default = field.get_default(call_default_factory=True)
    if default is None or default == []:
        return "none"
    if isinstance(default, bool):
        return "on" if default else "off"
    if opt.unit != 1.0 and isinstance(default, int | float):
        return f"{default / opt.unit:g}"
    return f"{default:g}" if isinstance(default, float) else str(default)


def add_model_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """Every field of `model` with an Option as a flag, in its group (its default None: "not given" stays
    apart from a value)."""
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items() if key != "server"}
    for name, opt in field_options(model):
        target: Any = parser if opt.group == "server" else groups[opt.group]
        field = model.model_fields[name]
        annotation = field.annotation
        help_text = f"{opt.help} (default: {_shown_default(model, name, opt)}; env {env_name(name, opt)})"
        flag = flag_of(name, opt)
        if annotation is bool:
            target.add_argument(flag, dest=name, action="store_const", const=not opt.negate, default=None,
                                help=help_text)
        elif get_origin(annotation) is list:
            target.add_argument(flag, dest=name, action="append", default=None, metavar=opt.metavar, help=help_text)
        elif get_origin(annotation) is Literal:
            target.add_argument(flag, dest=name, choices=get_args(annotation), default=None, help=help_text)
        elif opt.parse is not None:
            target.add_argument(flag, dest=name, type=_argparse_type(opt.parse), default=None, metavar=opt.metavar,
                                help=help_text)
        else:
            kind = _base_type(annotation)
            convert = {int: int, float: float, Path: Path, str: str}.get(kind, str)
            target.add_argument(flag, dest=name, type=convert, default=None, metavar=opt.metavar, help=help_text)


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` for argparse, which shows an ArgumentTypeError's own words ("argument --workers: ...")."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


def model_markdown_table(model: type[BaseModel]) -> str:
    """The docs' table of `model`'s flags: flag, environment variable, default, help."""
    lines = ["| flag | environment | default | |", "|---|---|---|---|"]
    for name, opt in field_options(model):
        flag = flag_of(name, opt) + (f" {opt.metavar}" if opt.metavar else "")
        text = opt.help.replace("|", "\\|")
        lines.append(f"| `{flag}` | `{env_name(name, opt)}` | `{_shown_default(model, name, opt)}` | {text} |")
    return "\n".join(lines)
