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
length lists, which the op does not read), and so does a call with an attention variant
(the service's query and ``fa2tune tune``'s command line name no variant yet: a variant
call is served by its variant's tuned configs in the local results, else its default).
In ``off`` mode none of this runs: every call gets its default config, with no database
opened and no service asked (a baseline, or a process that must not read results).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.shape import Shape
from core.variant import Variant
from fa2tune.ops import autotune
from fa2tune.ops.choice import Call, Choice, check_supported, choose, forget_results, open_store
from fa2tune.ops.remote import reset_service_state, service_choice

__all__ = ["Call", "Selected", "job_tag", "reset_service_state", "select"]


def job_tag(job: autotune.TuneJob) -> tuple[int, str, int, bool, Shape, Variant]:
    """:attr:`Call.tag` of the call a job was started for."""
    p = job.problem
    return (job.device, p.dtype, p.d, p.causal,
            Shape(p.n, p.n_keys, p.batch, p.heads, p.n_kv_heads), p.variant)  # fmt: skip


def _results_written(job: autotune.TuneJob) -> None:
    """A tuning job ended (it may have written results): read the store again."""
    forget_results()


autotune.add_listener(_results_written)


@dataclass(frozen=True)
class Selected:
    """A decision: the choice and whether a tuning job was started for the shape."""

    choice: Choice
    tuning: bool = False

    def describe(self, call: Call) -> str:
        line = self.choice.describe(call.shape)
        return line + ("; tuning it in the background" if self.tuning else "")


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
    plain = call.variant.plain
    check_supported(call.dtype, call.d, call.compute_capability, packed=not dense)
    problem = call.problem() if dense and plain else None  # what first-use tuning would tune
    off = autotune.current().mode == "off"
    remote = None
    if settings.service_url and dense and plain and not off:
        remote = service_choice(call, settings.service_url, settings.service_timeout_s)
    choice = remote
    if remote is None or remote.source != "exact":
        local = choose(None if off else open_store(), call)
        # The service's nearest shape serves unless this shape was tuned here (first-use
        # tuning writes to the local database).
        if remote is None or local.source == "exact":
            choice = local
    assert choice is not None
    tuning = False
    if choice.source != "exact" and problem is not None and not off:
        tuning = autotune.current().consider(
            problem, call.device, settings.db_url, settings.cache_dir
        )
    return Selected(choice, tuning)
