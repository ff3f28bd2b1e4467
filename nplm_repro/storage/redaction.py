"""URIs with their credentials masked, wherever a run, a log or an error message records one: a store's URI may carry
its database password. A leaf of tracking/: every module that writes text about a store imports it, and it imports
none of them."""

from __future__ import annotations

import re

# The userinfo of a URI (`postgresql://user:password@host`) and a password in its query: what `redact` masks
USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
QUERY_SECRET = re.compile(r"([?&](?:password|passwd|pwd|token|secret)=)[^&#\s]*", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the credentials of every URI in it masked (`postgresql://***@host/db`), for anything a run, a log
    or an error message records: a store's URI may carry its database password."""
    return QUERY_SECRET.sub(r"\1***", USERINFO.sub(r"\1***@", text))
