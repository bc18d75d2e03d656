"""A batch's input file, checked as OpenAI checks it once the batch is made (status `validating`): a file with a bad
line makes the batch `failed`, its `errors` naming each bad line; an upload is only bounded in bytes.

Codes (those OpenAI's and Azure OpenAI's batches report): `invalid_json_line` (not a JSON object),
`missing_required_parameter` and `invalid_value` (`custom_id`, `method`, `url` or `body` absent or of the wrong
kind: `param` names it), `duplicate_custom_id`, `url_mismatch` (a `url` other than the batch's `endpoint`),
`too_many_tasks` (more lines than `--batch-max-lines`), `empty_batch`. `line` is 1-based, as OpenAI's; at most
`MAX_ERRORS` errors are listed (every line is still checked, the file being bounded in bytes).
"""

from __future__ import annotations

import json
from typing import Any

from openai_api.stored.batches import iter_lines

MAX_ERRORS = 100

Line = tuple[int, str, str, dict[str, Any]]  # (0-based index, custom_id, url, body)


def batch_error(code: str, message: str, param: str | None = None, line: int | None = None) -> dict[str, Any]:
    """One `BatchError` of a failed batch's `errors.data`."""
    return {"code": code, "message": message, "param": param, "line": line}


def check_input(content: bytes, endpoint: str, max_lines: int) -> tuple[list[Line], list[dict[str, Any]]]:
    """The lines of an input file and the errors that fail its batch (none: the batch runs). CPU work: off the
    event loop."""
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    count = 0
    for idx, raw in iter_lines(content):
        count += 1
        if count > max_lines:
            continue  # counted only: one error below names the bound
        found = _check_line(raw, idx, endpoint, seen)
        if isinstance(found, dict):
            if len(errors) < MAX_ERRORS:
                errors.append(found)
        else:
            lines.append(found)
    if count > max_lines:
        errors.insert(0, batch_error("too_many_tasks", f"The input file has {count} requests; this server takes at "
                                     f"most {max_lines} per batch."))
        del errors[MAX_ERRORS:]
    if not count:
        errors.append(batch_error("empty_batch", "The input file holds no requests."))
    return lines, errors


def _check_line(raw: bytes, idx: int, endpoint: str, seen: set[str]) -> Line | dict[str, Any]:
    at = idx + 1
    try:
        line = json.loads(raw)
    except ValueError:
        line = None
    if not isinstance(line, dict):
        return batch_error("invalid_json_line", "This line is not parseable as a JSON object.", line=at)
    for name, ok in (("custom_id", lambda v: isinstance(v, str) and v != ""), ("method", lambda v: v == "POST"),
                     ("url", lambda v: isinstance(v, str)), ("body", lambda v: isinstance(v, dict))):
        if name not in line:
            return batch_error("missing_required_parameter", f"Missing required parameter: '{name}'.", name, at)
        if not ok(line[name]):
            what = {"custom_id": "a non-empty string", "method": "'POST'", "url": "a string",
                    "body": "a JSON object"}[name]
            return batch_error("invalid_value", f"'{name}' must be {what}.", name, at)
    custom_id, url = line["custom_id"], line["url"]
    if custom_id in seen:
        return batch_error("duplicate_custom_id", f"The custom_id {custom_id[:64]!r} appears on an earlier line; "
                           "each request's custom_id must be unique in the batch.", "custom_id", at)
    seen.add(custom_id)
    if url != endpoint:
        return batch_error("url_mismatch", f"This line's url {url[:100]!r} is not the batch's endpoint "
                           f"{endpoint!r}.", "url", at)
    return idx, custom_id, url, line["body"]
