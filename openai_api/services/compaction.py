"""The `compaction` item of `POST /v1/responses/compact`, as this gateway writes and reads it.

OpenAI's compaction item carries the summary of a conversation as opaque `encrypted_content`, which only the
issuer reads back. This gateway's is not encrypted: it is `gw-compaction-v1:` followed by the summary's UTF-8
text in base64 (standard alphabet, padded). The client holds nothing it could not have sent as a user
message, so there is nothing to keep secret; what matters is that it comes back intact, so reading it back
(`read_compaction`) is strict: the tag, valid base64, valid UTF-8, and at most `MAX_SUMMARY_CHARS` characters
of summary, else a 400 naming the item. Another issuer's compaction (OpenAI's own) cannot be read here and is
refused the same way rather than dropped, since dropping it would lose the whole earlier conversation.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from openai_api.errors import InvalidRequestError

COMPACTION_TAG = "gw-compaction-v1:"
# A summary is a few thousand tokens at most; this bounds what one item may put in a prompt, well under the
# body limit (which bounds the item itself on the way in).
MAX_SUMMARY_CHARS = 256 * 1024
# How a summary is shown to the model when the compacted conversation continues: as a user message.
SUMMARY_PREFIX = "Summary of the earlier conversation, which was compacted:\n\n"


def write_compaction(summary: str) -> str:
    """A compaction item's `encrypted_content` for `summary` (see the module docstring)."""
    return COMPACTION_TAG + base64.b64encode(summary.encode()).decode("ascii")


def read_compaction(value: Any, where: str) -> str:
    """The summary in a compaction item's `encrypted_content`; a 400 naming `where` when it is not one this
    gateway wrote, or is larger than `MAX_SUMMARY_CHARS`."""
    param = f"{where}.encrypted_content"
    if not isinstance(value, str) or not value.startswith(COMPACTION_TAG):
        raise InvalidRequestError(
            f"'{param}' is not a compaction this server made (it reads back only the compaction items its own "
            "/v1/responses/compact returned); send the conversation itself instead.", param=param,
            code="invalid_encrypted_content")
    body = value[len(COMPACTION_TAG):]
    if len(body) > (MAX_SUMMARY_CHARS * 4 + 2) // 3 * 4:  # base64 of the longest summary in UTF-8 bytes, bounded
        raise InvalidRequestError(f"'{param}' is larger than a compaction this server makes.", param=param,
                                  code="invalid_encrypted_content")
    try:
        summary = base64.b64decode(body, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise InvalidRequestError(f"'{param}' is damaged: it is not the base64 UTF-8 text this server wrote.",
                                  param=param, code="invalid_encrypted_content") from None
    if len(summary) > MAX_SUMMARY_CHARS:
        raise InvalidRequestError(f"'{param}' is larger than a compaction this server makes.", param=param,
                                  code="invalid_encrypted_content")
    return summary


def summary_message(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A compaction input item as the chat message the model reads."""
    return {"role": "user", "content": SUMMARY_PREFIX + read_compaction(item.get("encrypted_content"), where)}
