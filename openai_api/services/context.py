"""What a service is told about a request besides its typed body: the explicit request context.

The HTTP edge builds one per request (`http.deps.request_context`) and passes it down with the body; no
service reads HTTP state back out of a context variable. `request_id` is the request's id (also Triton's
request id); `caller` who is calling (the key's name, team and policy; the anonymous caller without keys);
`headers` the request's headers as the server read them (lower-case names), from which routing takes a
session key for replica affinity (`triton.routing.session_key`: the configured session header, or a coding
agent's session header).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from openai_api.quota.caller import Caller
from openai_api.quota.keys import ANONYMOUS

Headers = Sequence[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str
    caller: Caller = field(default_factory=lambda: Caller(ANONYMOUS))
    headers: Headers = ()
