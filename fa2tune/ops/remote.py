"""Asking a running fa2tune service which config serves a call (torch-free).

``GET {url}/v1/best`` with the call's whole shape (``gpu``, ``d``, ``nq``, ``nk``, ``batch``,
``heads``, ``kv_heads``, ``dtype``, ``causal``; see docs/service.md) answers with the winner
measured at the shape or at the nearest tuned one, as the local database would. A 404 (the
service has nothing for this GPU, head dim, dtype and mask) is an answer: None, and the local
database is asked next. Anything else that goes wrong (no connection, a timeout, a 5xx, a
body that is not a config) is :class:`ServiceUnavailable`: the caller warns once and uses the
local choice.

Standard library only (:mod:`urllib`): the base install has no HTTP client.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from core.family import config_from_name
from core.shape import Shape
from fa2tune.ops.choice import Choice


class ServiceUnavailable(RuntimeError):
    """The service did not give a usable answer (unreachable, timed out, an error status or a
    body without a config)."""


def best_url(base: str, gpu: str, d: int, dtype: str, causal: bool, shape: Shape) -> str:
    """The ``/v1/best`` request for one call."""
    query = urllib.parse.urlencode(
        {
            "gpu": gpu, "d": d, "nq": shape.nq, "nk": shape.nk, "batch": shape.batch,
            "heads": shape.heads, "kv_heads": shape.kv_heads, "dtype": dtype,
            "causal": "true" if causal else "false",
        }
    )  # fmt: skip
    return f"{base.rstrip('/')}/v1/best?{query}"


def parse_best(body: Any, d: int, dtype: str, causal: bool) -> Choice:
    """The :class:`Choice` a ``/v1/best`` body names.

    Raises:
        ServiceUnavailable: the body is not a ``/v1/best`` answer for this call.
    """
    try:
        config = config_from_name(str(body["config"]["name"]))
        exact = bool(body["exact"])
        m = body["measured_problem"]
        measured = Shape(int(m["n"]), int(m["nk"]), int(m["batch"]), int(m["heads"]),
                         int(m["kv_heads"]))  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ServiceUnavailable(f"the service's answer is not a config: {exc!r}") from None
    if (config.d, config.dtype, config.causal) != (d, dtype, causal):
        raise ServiceUnavailable(
            f"the service answered {config.name} for D={d} {dtype} causal={causal}"
        )
    return Choice(config, "exact" if exact else "nearest", measured, origin="service")


def ask_service(
    base: str,
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    shape: Shape,
    *,
    timeout_s: float,
) -> Choice | None:
    """The service's choice for a call; None when it has nothing tuned for it (404).

    Raises:
        ServiceUnavailable: no usable answer within ``timeout_s``.
    """
    url = best_url(base, gpu, d, dtype, causal, shape)
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise ServiceUnavailable(f"GET {url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, timeout, bad JSON
        raise ServiceUnavailable(f"GET {url}: {exc}") from None
    return parse_best(body, d, dtype, causal)
