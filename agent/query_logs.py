"""What people typed or said stays out of the access log, though it came in a query string.

uvicorn logs every HTTP request line at INFO with its query string ("GET
/api/agents/desk/search?q=call+me+at+415+555+0134 HTTP/1.1" 200) and every accepted WebSocket
with its own. A query can carry a caller's words (a search for what a caller asked, a file
name), and an INFO log is shipped and shared without a second thought. So the access lines
keep the path and every parameter's name, and the value only of the parameters in
`LOGGED_PARAMETERS`, which name or count things (an agent, a page size) and help read the log;
any other value becomes `[redacted]`, so a new route's free-text parameter is masked until
someone lists it here.
"""

from __future__ import annotations

import logging
import re

LOGGED_PARAMETERS = frozenset({"agent", "model", "k", "mode", "limit", "offset", "since", "window_s", "bucket_s",
                               "transport", "diarize", "speakers"})
# uvicorn's HTTP access lines, and its WebSocket lines ('"WebSocket /v1/realtime?model=x" [accepted]').
ACCESS_LOGGERS = ("uvicorn.access", "uvicorn.error")
REDACTED = "[redacted]"
_PARAMETER = re.compile(r"([?&])([^=&\s\"#]*)=([^&\s\"#]*)")


def masked_query(text: str) -> str:
    """`text` with the values of query parameters not in LOGGED_PARAMETERS masked."""
    return _PARAMETER.sub(lambda m: m[0] if m[2] in LOGGED_PARAMETERS or not m[3] else f"{m[1]}{m[2]}={REDACTED}",
                          text)


class QueryTextRedactor(logging.Filter):
    """Masks the record's arguments one by one, not its formatted message: uvicorn's access
    formatter unpacks the arguments (client, method, path, version, status) to colour them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(masked_query(a) if isinstance(a, str) and "=" in a else a for a in record.args)
        elif not record.args and isinstance(record.msg, str) and "=" in record.msg:
            record.msg = masked_query(record.msg)
        return True


_REDACTOR = QueryTextRedactor()  # stateless: one instance, so installing it twice adds it once


def keep_query_text_out_of_logs() -> None:
    """Idempotent; call after uvicorn.Config, which configures uvicorn's loggers."""
    for name in ACCESS_LOGGERS:
        logging.getLogger(name).addFilter(_REDACTOR)
