"""One call's decision, from every source in order (torch-free).

:func:`select` is what the op asks the first time it sees a call's key, for a dense call and
a packed batch alike (a :class:`~fa2tune.ops.choice.Call`, ``packed`` set for the latter):

1. a running fa2tune service, when ``FA2TUNE_SERVICE_URL`` is set (:mod:`fa2tune.ops.remote`;
   unreachable: one warning, then the local choice; a 404 is "nothing tuned there"): its
   answer for exactly this shape serves;
2. the shipped results and the local database (:func:`~fa2tune.ops.choice.choose`: the exact
   shape, else the nearest tuned shape, else a default); a shape tuned exactly here beats the
   service's nearest shape, which beats the local nearest or default;
3. then, in ``on_first_call`` mode (:mod:`fa2tune.ops.autotune`), a shape not measured
   exactly starts one background tuning job; the choice above serves meanwhile.

A packed batch asks only the local results (the service and first-use tuning take whole
length lists, which the op does not read). In ``off`` mode none of this runs: every call gets
its default config, with no database opened and no service asked (a baseline, or a process
that must not read results).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from core.shape import Shape
from fa2tune.ops import autotune
from fa2tune.ops.choice import Call, Choice, builds_here, check_supported, choose, open_store

log = logging.getLogger("fa2tune.torch")

#: After the service failed to answer, it is not asked again for this long (s): a dead URL
#: must not cost every new shape a timeout.
SERVICE_RETRY_S = 60.0

__all__ = ["SERVICE_RETRY_S", "Call", "Selected", "job_tag", "reset_service_state", "select"]


def job_tag(job: autotune.TuneJob) -> tuple[int, str, int, bool, Shape]:
    """:attr:`Call.tag` of the call a job was started for."""
    p = job.problem
    return (job.device, p.dtype, p.d, p.causal,
            Shape(p.n, p.n_keys, p.batch, p.heads, p.n_kv_heads))  # fmt: skip


@dataclass(frozen=True)
class Selected:
    """A decision: the choice and whether a tuning job was started for the shape."""

    choice: Choice
    tuning: bool = False

    def describe(self, call: Call) -> str:
        line = self.choice.describe(call.shape)
        return line + ("; tuning it in the background" if self.tuning else "")


_service_lock = threading.Lock()
_service_down: dict[str, float] = {}  # URL -> when it last failed (monotonic)
_service_warned: set[str] = set()


def _from_service(call: Call, url: str, timeout_s: float) -> Choice | None:
    from fa2tune.ops.remote import ServiceUnavailable, ask_service

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
    if choice is not None and not builds_here(choice.config, call.compute_capability):
        return None
    return choice


def select(call: Call) -> Selected:
    """The config for ``call`` (service, then local results, then a default; only the
    default in ``off`` mode) and, in ``on_first_call`` mode, a tuning job for a dense shape
    not tuned exactly.

    Raises:
        Unsupported: no family serves the dtype, head dim or GPU.
    """
    from core.settings import get_settings

    settings = get_settings()
    dense = call.packed is None
    check_supported(call.dtype, call.d, call.compute_capability, packed=not dense)
    if autotune.current().mode == "off":
        return Selected(choose(None, call))
    remote = None
    if settings.service_url and dense:
        remote = _from_service(call, settings.service_url, settings.service_timeout_s)
    choice = remote
    if remote is None or remote.source != "exact":
        local = choose(open_store(), call)
        # The service's nearest shape serves unless this shape was tuned here (first-use
        # tuning writes to the local database).
        if remote is None or local.source == "exact":
            choice = local
    assert choice is not None
    tuning = False
    if choice.source != "exact" and dense:
        tuning = autotune.current().consider(
            call.problem(), call.device, settings.db_url, settings.cache_dir
        )
    return Selected(choice, tuning)


def reset_service_state() -> None:
    """Forget failed services and warnings (tests)."""
    with _service_lock:
        _service_down.clear()
        _service_warned.clear()
