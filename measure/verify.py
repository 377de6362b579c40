"""Checking a kernel's output against the float32 reference of an :class:`InputSet`.

The rule (:func:`check_output`); an output passes when all of these hold:

1. **Everything was written.** O and LSE are poisoned with NaN before the launch
   (:func:`poison`), so an unwritten element stays NaN. Every element of O must be finite —
   over the *whole* tensor, not only the pairs the reference covers.
2. **Rows that see no key** (bottom-right causal with nq > nk; with a variant, also windows
   and chunks that leave leading rows nothing, :func:`measure.reference.dead_row_count`) have
   O exactly 0 and LSE exactly -inf, as the ABI specifies, or with sinks LSE = the head's
   sink logit (within the LSE tolerance of rule 3); every other LSE is finite. A KV-cache
   problem of mixed lengths counts them per batch row, of that sequence's own keys
   (:attr:`measure.reference.InputSet.key_lengths`).
3. **LSE** agrees with the reference on the checked pairs within
   ``LSE_ABS_TOL + LSE_REL_TOL * |ref|`` (LSE is a float32 reduction of exactly computed
   scores, so only accumulation order differs; a wrong scale or log base is far outside).
4. **O** agrees on the checked pairs within ``max(2 * ref_err, floor)``: twice the error torch
   SDPA (flash backend, else efficient) makes on the same inputs, but never tighter than a
   floor, so a lucky SDPA run cannot fail an honest kernel. The floor is the larger of a
   per-dtype constant (``1e-3`` fp16, ``8e-3`` bf16) and twice the rounding error of storing the
   largest reference value in the dtype (``2 * u * max|ref|`` with unit roundoff ``u`` =
   2^-11 fp16, 2^-8 bf16): with few keys per row outputs reach magnitudes of 2-4, where one
   rounding alone is as large as the constant. Without an SDPA yardstick the floor applies.
   SDPA computes no variant (window, chunk, softcap, sinks): a variant's yardstick is the
   reference computed with a kernel's roundings instead
   (:func:`measure.reference.emulated_error`).

``max_abs_err`` is ``max |O - ref|`` and ``rel_err`` is ``||O - ref||_2 / ||ref||_2``, both
over the checked pairs' live rows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from measure.reference import InputSet, as_bhnd, errors_vs_reference

if TYPE_CHECKING:
    import torch

#: Smallest O tolerance per dtype (about a few ulps of outputs of magnitude ~1).
ERROR_FLOOR: dict[str, float] = {"fp16": 1e-3, "bf16": 8e-3}
#: Unit roundoff of the storage type (half an ulp at 1.0).
UNIT_ROUNDOFF: dict[str, float] = {"fp16": 2.0**-11, "bf16": 2.0**-8}
#: Multiple of SDPA's own error the kernel may make.
SDPA_FACTOR = 2.0
LSE_ABS_TOL = 1e-2
LSE_REL_TOL = 1e-3


class CheckResult(NamedTuple):
    """Outcome of :func:`check_output`; unpacks as ``(ok, max_abs_err, rel_err, message)``.

    ``max_abs_err``/``rel_err`` are ``inf`` when the output has non-finite values and ``nan``
    when the check failed before comparing values (dead rows, LSE).
    """

    ok: bool
    max_abs_err: float
    rel_err: float
    message: str


def error_floor(dtype: str, ref_absmax: float = 0.0) -> float:
    """The smallest O tolerance: ``max(ERROR_FLOOR[dtype], 2 * u * ref_absmax)``."""
    const = ERROR_FLOOR.get(dtype, ERROR_FLOOR["bf16"])
    u = UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["bf16"])
    return max(const, 2.0 * u * ref_absmax)


def tolerance(inputs: InputSet) -> float:
    """O tolerance for ``inputs``: ``max(2 * ref_err, floor)``, see :func:`error_floor`."""
    floor = error_floor(inputs.problem.dtype, inputs.ref_absmax)
    if inputs.ref_err is None or not math.isfinite(inputs.ref_err):
        return floor
    return max(SDPA_FACTOR * inputs.ref_err, floor)


def poison(out: torch.Tensor, lse: torch.Tensor | None) -> None:
    """Fill the output buffers with NaN so unwritten elements are caught."""
    out.fill_(float("nan"))
    if lse is not None:
        lse.fill_(float("nan"))


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out: list[int] = []
    for size in reversed(shape):
        out.append(index % size)
        index //= size
    return tuple(reversed(out))


def _first_nonfinite(ob: torch.Tensor) -> tuple[int, tuple[int, int, int, int]] | None:
    """(count, (b, h, row, col) of the first) non-finite elements of a [B, H, N, D] view."""
    import torch

    count = 0
    first: tuple[int, int, int, int] | None = None
    # One batch at a time bounds the temporary masks at large N.
    for bi in range(ob.shape[0]):
        bad = ~torch.isfinite(ob[bi])
        n = int(bad.sum())
        if n and first is None:
            idx = int(torch.argmax(bad.reshape(-1).to(torch.uint8)))
            h, row, col = _unravel(idx, tuple(bad.shape))
            first = (bi, h, row, col)
        count += n
    return (count, first) if first is not None else None


def _dead_rows_failure(
    ob: torch.Tensor, lse: torch.Tensor | None, sinks: torch.Tensor | None, dead: int
) -> str | None:
    """What is wrong with the leading ``dead`` rows (they see no key) and the LSE of the rows
    after them, of a ``[b, H, N, D]`` view of O and its ``[b, H, N]`` LSE (rules 2 and 3's
    finiteness); None when nothing is."""
    import torch

    if dead:
        if not bool((ob[:, :, :dead] == 0).all()):
            return f"the first {dead} rows see no key but O is not 0 there"
        if lse is not None and sinks is None:
            if not bool(torch.isneginf(lse[:, :, :dead]).all()):
                return f"the first {dead} rows see no key but LSE is not -inf there"
        elif lse is not None and sinks is not None:
            sink = sinks.float()[None, :, None]
            off = (lse[:, :, :dead] - sink).abs() - (LSE_ABS_TOL + LSE_REL_TOL * sink.abs())
            if not bool((off <= 0).all()):  # NaN fails too
                return f"the first {dead} rows see no key but LSE is not their head's sink logit"
    if lse is not None:
        live_lse = lse[:, :, dead:]
        if not bool(torch.isfinite(live_lse).all()):
            n_bad = int((~torch.isfinite(live_lse)).sum())
            return f"LSE has {n_bad} non-finite values on live rows"
    return None


def check_output(out: torch.Tensor, lse: torch.Tensor | None, inputs: InputSet) -> CheckResult:
    """Check a kernel's output (stored in ``inputs.layout``) and LSE against ``inputs``.

    See the module docstring for the rule.

    Args:
        out: the kernel's O.
        lse: the kernel's LSE ``[B, Hq, Nq]`` float32, or ``None`` when it was not requested.
        inputs: inputs and reference the kernel ran on.
    """
    nan = float("nan")
    ob = as_bhnd(out, inputs.layout)
    total = ob.numel()
    bad = _first_nonfinite(ob)
    if bad is not None:
        count, (bi, h, row, col) = bad
        hint = " (never written?)" if count == total else ""
        return CheckResult(
            False,
            math.inf,
            math.inf,
            f"O has {count} non-finite values of {total} ({100.0 * count / total:.1f}%){hint}; "
            f"first at b={bi} h={h} row={row} col={col}",
        )

    for start, stop, dead in inputs.dead_spans():
        rows_lse = None if lse is None else lse[start:stop]
        why = _dead_rows_failure(ob[start:stop], rows_lse, inputs.sinks, dead)
        if why is not None:
            # One span is the whole batch (every row holds nk keys): the message as it was.
            where = "" if (start, stop) == (0, ob.shape[0]) else f"batch rows {start}-{stop - 1}: "
            return CheckResult(False, nan, nan, where + why)

    errs = errors_vs_reference(out, inputs)
    tol = tolerance(inputs)
    yard = (
        f"{SDPA_FACTOR:g} x sdpa-{inputs.ref_backend} {inputs.ref_err:.2e}"
        if inputs.ref_err is not None
        else "no SDPA yardstick"
    )
    floor = error_floor(inputs.problem.dtype, inputs.ref_absmax)
    tol_text = f"tol {tol:.2e} = max({yard}, floor {floor:.2e})"

    if lse is not None:
        worst_lse = 0.0
        worst_at = (0, 0, 0)
        for p, (bi, hi) in enumerate(inputs.pairs):
            dead = inputs.dead_rows_of(bi)
            ref = inputs.ref_lse[p, dead:]
            got = lse[bi, hi, dead:]
            excess = (got - ref).abs() - (LSE_ABS_TOL + LSE_REL_TOL * ref.abs())
            m = float(excess.max())
            if m > worst_lse:
                worst_lse = m
                worst_at = (bi, hi, int(excess.argmax()) + dead)
        if worst_lse > 0.0:
            bi, hi, row = worst_at
            p = inputs.pairs.index((bi, hi))
            return CheckResult(
                False,
                errs.max_abs,
                errs.rel,
                f"LSE wrong at b={bi} h={hi} row={row}: got {float(lse[bi, hi, row]):.6g}, "
                f"reference {float(inputs.ref_lse[p, row]):.6g} "
                f"(tol {LSE_ABS_TOL:g} + {LSE_REL_TOL:g}*|ref|)",
            )

    b, h, row, col = errs.worst
    if errs.max_abs > tol:
        return CheckResult(
            False,
            errs.max_abs,
            errs.rel,
            f"max |O - ref| = {errs.max_abs:.3e} > {tol_text} at b={b} h={h} row={row} "
            f"col={col}; rel err {errs.rel:.2e}",
        )
    return CheckResult(
        True, errs.max_abs, errs.rel, f"max |O - ref| = {errs.max_abs:.3e}, {tol_text}"
    )
