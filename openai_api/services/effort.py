"""Reasoning controls: an API's effort level and thinking switch as the model's own template variables.

Templates are told how to think in different ways: gpt-oss's (harmony) reads `reasoning_effort`
(`low` / `medium` / `high`); Qwen3's, GLM-4.5's and Hermes-style ones read `enable_thinking` (a boolean);
DeepSeek-V3.1's reads `thinking` (a boolean). `reasoning_kwargs` sets exactly the ones the model's template
reads (`ChatTemplate.reads`, its undeclared variables), so a request never passes a variable the template
would ignore or misread, and a model whose template has no such control is unaffected.

Effort levels in (OpenAI's `reasoning.effort`: none, minimal, low, medium, high, xhigh; Anthropic's
`output_config.effort`: low, medium, high, max):

* `reasoning_effort` gets the nearest of the three levels templates know: none / minimal / low -> `low`,
  medium -> `medium`, high / xhigh / max -> `high`.
* a boolean switch gets `thinking` when the request says it outright (Anthropic's `thinking` enabled /
  adaptive -> on, disabled -> off); otherwise from the effort: none and minimal -> off (a switch cannot
  think "a little"), any other level -> on. No effort and no switch: nothing is set (the template's
  default).

A thinking budget in tokens is not an effort: it stays the generation core's `thinking_token_budget`.
"""

from __future__ import annotations

from typing import Any

from openai_api.text.templates import ChatTemplate

# Every effort level either API defines, by its nearest `reasoning_effort` level.
EFFORT_LEVELS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
                 "xhigh": "high", "max": "high"}
_OFF_LEVELS = frozenset({"none", "minimal"})
# The boolean thinking switches templates read, in the order they are looked for.
SWITCHES = ("enable_thinking", "thinking")


def reasoning_kwargs(template: ChatTemplate | None, effort: str | None = None,
                     thinking: bool | None = None) -> dict[str, Any]:
    """The chat template keyword arguments for `effort` (a key of `EFFORT_LEVELS`, checked by the caller)
    and the explicit switch `thinking` (see the module docstring); {} for a model without a template."""
    if template is None:
        return {}
    out: dict[str, Any] = {}
    if effort is not None and template.reads("reasoning_effort"):
        out["reasoning_effort"] = EFFORT_LEVELS[effort]
    switch = thinking if thinking is not None else (None if effort is None else effort not in _OFF_LEVELS)
    if switch is not None:
        for name in SWITCHES:
            if template.reads(name):
                out[name] = switch
    return out
