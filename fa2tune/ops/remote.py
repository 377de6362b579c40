"""Asking a running fa2tune service which config serves a call (torch-free).

``GET {url}/v1/best`` with the call's whole shape (``gpu``, ``d``, ``nq``, ``nk``, ``batch``,
``heads``, ``kv_heads``, ``dtype``, ``causal``; see docs/service.md) answers with the winner
measured at the shape or at the nearest tuned one, as the local database would. A 404 (the
service has nothing for this GPU, head dim, dtype and mask) is an answer: None, and the local
database is asked next. Anything else that goes wrong (no connection, a timeout, a 5xx, a
body that is not a config) is :class:`ServiceUnavailable`: the caller warns once and uses the
local choice.

Standard library only (:mod:`urllib`): the base install has no HTTP client.
:func:`service_choice` is what :func:`fa2tune.ops.selection.select` asks: the answer if its
family builds here, with the state that keeps a dead URL from being asked again soon.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from codegen.families import family_of
from core.family import config_from_name
from core.shape import Shape
from fa2tune.ops.choice import Call, Choice

log = logging.getLogger("fa2tune.torch")

#: After the service failed to answer, it is not asked again for this long (s): a dead URL
#: must not cost every new shape a timeout.
SERVICE_RETRY_S = 60.0


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


_service_lock = threading.Lock()
_service_down: dict[str, float] = {}  # URL -> when it last failed (monotonic)
_service_warned: set[str] = set()


def service_choice(call: Call, url: str, timeout_s: float) -> Choice | None:
    """The service's choice for a dense call, or None: nothing tuned there (404), a config
    whose family does not build here, or no answer (warned once per URL; the URL is then not
    asked again for :data:`SERVICE_RETRY_S`)."""
    with _service_lock:
        failed = _service_down.get(url)
        if failed is not None and time.monotonic() - failed < SERVICE_RETRY_S:
            return None
    try:
        choice = ask_service(url, call.gpu, call.d, call.dtype, call.causal, call.shape,
                             timeout_s=timeout_s)  # fmt: skip
    except ServiceUnavailable as exc:
        with _service_lock:
            _service_down[url] = time.monotonic()
            first = url not in _service_warned
            _service_warned.add(url)
        if first:
            log.warning("fa2tune.torch: the fa2tune service at %s did not answer (%s); "
                        "choosing from local results", url, exc)  # fmt: skip
        return None
    if choice is not None and family_of(choice.config).arch_for(call.compute_capability) is None:
        return None
    return choice


def reset_service_state() -> None:
    """Forget failed services and warnings (tests)."""
    with _service_lock:
        _service_down.clear()
        _service_warned.clear()
