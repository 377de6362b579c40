"""One router module per resource."""

from __future__ import annotations

from typing import Any


def json_error(model: str, description: str) -> dict[str, Any]:
    """An error response documented as ``application/json`` with a component's schema.

    For a route whose own responses are not JSON (``response_class=PlainTextResponse``),
    FastAPI files ``{"model": ...}`` responses under the route's media type, which is not
    what the error handlers send; this names the JSON schema explicitly.
    (``service.main`` makes sure the components exist.)
    """
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
    }


#: The refusals of the slow endpoints' admission (:mod:`service.admission`), documented.
SLOW_REFUSALS: dict[int | str, dict[str, Any]] = {
    429: json_error("ErrorOut", "too many requests waiting for this endpoint (Retry-After)"),
    503: json_error(
        "ErrorOut",
        "not served within the queue's wait, the database is unavailable (Retry-After), or "
        "(header export) the kernel template is not installed",
    ),
}
