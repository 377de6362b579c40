"""Workload files: the attention calls a model makes, as problems for ``fa2tune tune``.

A workload file (YAML or JSON, chosen by the extension) is either a list of entries or a
mapping with ``shapes:`` (the list) and an optional ``name:``. Each entry is one kind of call::

    - label: decode            # free text, for logs
      d: 128
      dtype: fp16              # fp16 | bf16 | both (default fp16)
      causal: false            # true | false | both (default false)
      batch: [1, 8, 64]        # default 1
      heads: 32
      kv_heads: 8              # default heads (GQA when smaller)
      nq: 1                    # or n: (Nq = Nk)
      nk: [1024, 8192]         # default nq

``n``, ``nq``, ``nk`` and ``batch`` take one value or a list (every combination is tuned);
``heads`` and ``kv_heads`` are the model's, one value each. An entry with ``seqlens:`` instead
of lengths is a packed variable-length batch (prefill of sequences of different lengths, run by
the varlen kernels): one list of lengths, or a list of such lists (one problem each); ``batch``
is then their count and must not be given. Every error is one line naming the file, the entry
and the field (:class:`WorkloadError`).

An entry may ask for an attention variant (:mod:`core.variant`, FlashAttention's semantics)::

      window: [4096, 0]        # window_size (left, right), -1: no bound; or
      window: 4096             # a causal sliding window: (4096, 0), and the entry is causal
      chunk: 8192              # chunked attention (0: none)
      softcap: 30.0            # logit softcap (0: none)
      sinks: true              # attention sinks

Each problem's variant is normalised with its lengths (:func:`core.variant.normalize`): a
window past every key is none, so such a problem is the plain one.

An entry may ask for calls over a KV cache whose lengths live on the device (the split-KV
family's cache kernels, docs/splitkv_kernel.md), tuned per layout::

      kv_page: 16              # a paged cache of 16-token pages; 0: a contiguous cache;
      kv_page: [0, 16]         # or a list (each layout is a problem of its own)

``nq`` is then the query rows per decode step and ``nk`` the keys each sequence holds; an
entry with ``seqlens`` takes no ``kv_page``. Beside ``kv_page``, the lengths the batch's
sequences hold (:mod:`core.kv_lengths`)::

      kv_lengths: mixed        # a seeded spread up to nk, as a serving batch; full: nk each
      kv_lengths: [full, mixed]  # or both (each pattern is a problem of its own)

``full`` is the default; ``kv_lengths`` without ``kv_page`` is an error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
)

from core.config import DTYPES, HEAD_DIMS, HEAD_DIMS_RULE, Dtype
from core.kv_lengths import KvLengths, describe_kv_lengths
from core.problem import KV_PAGE_RULE, Problem, describe_kv_page, kv_page_error
from core.shape import MAX_DIM, Shape, ShapeError
from core.shape_request import ShapeParamError, resolve_variant
from core.variant import PLAIN, Variant

log = logging.getLogger(__name__)

#: File extensions read as YAML, and as JSON.
YAML_SUFFIXES: Final = (".yaml", ".yml")
JSON_SUFFIXES: Final = (".json",)
#: In ``dtype`` and ``causal``: every value.
BOTH: Final = "both"


class WorkloadError(ValueError):
    """A workload file that cannot be read or is not valid; the message is one line."""


@dataclass(frozen=True)
class Target:
    """One problem to tune, before the GPU (part of a :class:`~core.problem.Problem`) is known.

    Attributes:
        d: head dim.
        dtype: element type.
        causal: causal mask.
        shape: lengths, batch and heads.
        label: where it came from, for logs; not part of its identity (two entries asking
            for the same problem are tuned once).
        seqlens: a packed variable-length batch's lengths (None: dense).
        variant: the attention variant, normalised (plain by default).
        kv_page: the KV-cache layout (:attr:`core.problem.Problem.kv_page`; None: dense).
        kv_lengths: a cache problem's length pattern (:attr:`core.problem.Problem.kv_lengths`).
    """

    d: int
    dtype: Dtype
    causal: bool
    shape: Shape
    label: str | None = field(default=None, compare=False)
    seqlens: tuple[int, ...] | None = None
    variant: Variant = PLAIN
    kv_page: int | None = None
    kv_lengths: str = "full"

    def problem(self, gpu: str) -> Problem:
        """The problem on ``gpu``; ``nk`` and ``kv_heads`` stay None when they equal ``n`` and
        ``heads``, so square, non-GQA problems keep the study names they always had."""
        s = self.shape
        if self.seqlens is not None:
            return Problem.varlen(
                gpu, self.d, self.seqlens, heads=s.heads,
                kv_heads=None if s.kv_heads == s.heads else s.kv_heads, dtype=self.dtype,
                causal=self.causal, variant=self.variant,
            )  # fmt: skip
        return Problem(
            gpu=gpu,
            d=self.d,
            n=s.nq,
            batch=s.batch,
            heads=s.heads,
            dtype=self.dtype,
            causal=self.causal,
            kv_heads=None if s.kv_heads == s.heads else s.kv_heads,
            nk=None if s.nk == s.nq else s.nk,
            variant=self.variant,
            kv_page=self.kv_page,
            kv_lengths=self.kv_lengths,
        )

    def describe(self) -> str:
        mask = "causal" if self.causal else "full"
        tail = "" if self.variant.plain else f", {self.variant.describe()}"
        if self.seqlens is not None:
            lens = self.seqlens
            return (
                f"D={self.d} {self.dtype} {mask} varlen {len(lens)} sequences of {min(lens)}-"
                f"{max(lens)} ({sum(lens)} tokens), H={self.shape.heads}/{self.shape.kv_heads}"
                f"{tail}"
            )
        if self.kv_page is not None:
            tail += f", over {describe_kv_page(self.kv_page)}"
            if self.kv_lengths != "full":
                tail += f", {describe_kv_lengths(self.kv_lengths)}"
        return f"D={self.d} {self.dtype} {mask} {self.shape.describe()}{tail}"

    def matches(self, problem: Problem) -> bool:
        """Whether ``problem`` (on any GPU) is this target."""
        return (
            problem.d == self.d
            and problem.seqlens == self.seqlens
            and problem.dtype == self.dtype
            and problem.causal == self.causal
            and problem.n == self.shape.nq
            and problem.n_keys == self.shape.nk
            and problem.batch == self.shape.batch
            and problem.heads == self.shape.heads
            and problem.n_kv_heads == self.shape.kv_heads
            and problem.variant == self.variant
            and problem.kv_page == self.kv_page
            and problem.kv_lengths == self.kv_lengths
        )


def _as_list(value: object) -> object:
    # One value or a list of them: the entry reads naturally either way.
    return value if isinstance(value, list) else [value]


def _dtypes(value: object) -> object:
    if value == BOTH:
        return list(DTYPES)
    return _as_list(value)


def _causals(value: object) -> object:
    if value == BOTH:
        return [False, True]
    if isinstance(value, bool):
        return [value]
    raise ValueError(f"must be true, false or {BOTH!r}, got {value!r}")


def _dim(value: int) -> int:
    if not 1 <= value <= MAX_DIM:
        raise ValueError(f"must be between 1 and {MAX_DIM}, got {value}")
    return value


def _head_dim(value: int) -> int:
    if value not in HEAD_DIMS:
        raise ValueError(f"must be {HEAD_DIMS_RULE}, got {value}")
    return value


def _dims(values: list[int]) -> list[int]:
    if not values:
        raise ValueError("must not be an empty list")
    for value in values:
        _dim(value)
    return list(dict.fromkeys(values))


DimList = Annotated[list[StrictInt], BeforeValidator(_as_list)]


def _kv_pages(values: list[int] | None) -> list[int] | None:
    if values is None:
        return None
    if not values:
        raise ValueError("must not be an empty list")
    for value in values:
        if kv_page_error(value) is not None:
            raise ValueError(f"must be {KV_PAGE_RULE}, got {value}")
    return list(dict.fromkeys(values))


def _kv_lengths(values: list[KvLengths] | None) -> list[KvLengths] | None:
    if values is None:
        return None
    if not values:
        raise ValueError("must not be an empty list")
    return list(dict.fromkeys(values))


class Entry(BaseModel):
    """One entry of a workload file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    d: StrictInt
    dtype: Annotated[list[Dtype], BeforeValidator(_dtypes)] = ["fp16"]
    causal: Annotated[list[bool], BeforeValidator(_causals)] = [False]
    batch: DimList = [1]
    heads: StrictInt
    kv_heads: StrictInt | None = None
    n: DimList | None = None
    nq: DimList | None = None
    nk: DimList | None = None
    label: str | None = None
    seqlens: list[tuple[int, ...]] | None = None
    window: tuple[StrictInt, StrictInt] | StrictInt | None = None
    chunk: StrictInt = 0
    softcap: StrictFloat | StrictInt = 0.0
    sinks: StrictBool = False
    kv_page: DimList | None = None
    kv_lengths: Annotated[list[KvLengths], BeforeValidator(_as_list)] | None = None

    @field_validator("d")
    @classmethod
    def _check_d(cls, value: int) -> int:
        return _head_dim(value)

    @field_validator("heads", "kv_heads")
    @classmethod
    def _check_heads(cls, value: int | None) -> int | None:
        return None if value is None else _dim(value)

    @field_validator("batch", "n", "nq", "nk")
    @classmethod
    def _check_lengths(cls, values: list[int] | None) -> list[int] | None:
        return None if values is None else _dims(values)

    @field_validator("kv_page")
    @classmethod
    def _check_kv_page(cls, values: list[int] | None) -> list[int] | None:
        return _kv_pages(values)

    @field_validator("kv_lengths")
    @classmethod
    def _check_kv_lengths(cls, values: list[KvLengths] | None) -> list[KvLengths] | None:
        return _kv_lengths(values)

    @field_validator("seqlens", mode="before")
    @classmethod
    def _check_seqlens(cls, value: object) -> object:
        # One list of lengths or a list of them; always a list of lists after this.
        lists = (
            value if isinstance(value, list) and value and isinstance(value[0], list) else [value]
        )
        out = []
        for lens in lists:
            if not isinstance(lens, list) or not lens:
                raise ValueError("must be a list of lengths, or a list of such lists")
            for n in lens:
                if isinstance(n, bool) or not isinstance(n, int):
                    raise ValueError(f"lengths must be integers, got {n!r}")
                _dim(n)
            if sum(lens) > MAX_DIM:
                raise ValueError(f"the lengths add up to {sum(lens)}, past {MAX_DIM}")
            out.append(tuple(lens))
        return out


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    shapes: list[Any]


@dataclass(frozen=True)
class Workload:
    """A parsed workload file.

    Attributes:
        path: the file.
        name: its ``name:`` (None when absent).
        targets: the problems, in file order, duplicates removed.
    """

    path: Path
    name: str | None
    targets: tuple[Target, ...]


def _read(path: Path) -> object:
    suffix = path.suffix.lower()
    if suffix not in YAML_SUFFIXES + JSON_SUFFIXES:
        allowed = ", ".join(YAML_SUFFIXES + JSON_SUFFIXES)
        raise WorkloadError(f"{path}: unknown extension {suffix or '(none)'!r}; use {allowed}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if suffix in JSON_SUFFIXES:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise WorkloadError(f"{path}: not valid JSON: {exc}") from None
    # Imported here: only YAML workloads need it.
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise WorkloadError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None


def _field_error(path: Path, index: int, exc: ValidationError) -> WorkloadError:
    err = exc.errors()[0]
    loc = err["loc"]
    name = str(loc[0]) if loc else "entry"
    if err["type"] == "extra_forbidden":
        return WorkloadError(f"{path}: entry {index}: unknown field {name!r}")
    if err["type"] == "missing":
        return WorkloadError(f"{path}: entry {index}: field {name!r} is required")
    if err["type"] == "value_error":
        message = str(err.get("ctx", {}).get("error", err["msg"]))
    else:
        message = f"{err['msg']}, got {err['input']!r}"
    return WorkloadError(f"{path}: entry {index}: field {name!r}: {message}")


def _window(entry: Entry, bad: Callable[[str, str], WorkloadError]) -> tuple[int, int, list[bool]]:
    """The entry's window bounds and its masks: ``window: N`` is the causal window (N, 0)."""
    if entry.window is None:
        return -1, -1, entry.causal
    if isinstance(entry.window, int):
        if "causal" in entry.model_fields_set and entry.causal != [True]:
            raise bad("window", "a single number is a causal window (N, 0); give [left, right] "
                      "for a window of a non-causal entry")  # fmt: skip
        return entry.window, 0, [True]
    return entry.window[0], entry.window[1], entry.causal


def _with_variant(
    entry: Entry, targets: list[Target], bad: Callable[[str, str], WorkloadError]
) -> list[Target]:
    """Each target with the entry's variant, normalised with its lengths (the mask too)."""
    left, right, _ = _window(entry, bad)
    out = []
    for t in targets:
        try:
            causal, variant = resolve_variant(
                t.causal, window_left=left, window_right=right, chunk=entry.chunk,
                softcap=float(entry.softcap), sinks=entry.sinks, nq=t.shape.nq, nk=t.shape.nk,
            )  # fmt: skip
        except ShapeParamError as exc:
            name = "window" if exc.param.startswith("window") else exc.param
            raise bad(name, str(exc)) from None
        out.append(dataclasses.replace(t, causal=causal, variant=variant))
    return out


def _entry_targets(path: Path, index: int, entry: Entry) -> list[Target]:
    def bad(name: str, message: str) -> WorkloadError:
        return WorkloadError(f"{path}: entry {index}: field {name!r}: {message}")

    _, _, causals = _window(entry, bad)
    if causals != entry.causal:
        entry = entry.model_copy(update={"causal": causals})
    targets = _with_variant(entry, _plain_targets(path, index, entry, bad), bad)
    if entry.kv_page is None:
        if entry.kv_lengths is not None:
            raise bad("kv_lengths", "a KV-cache call's length pattern: needs kv_page (0 for a "
                      "contiguous cache)")  # fmt: skip
        return targets
    if entry.seqlens is not None:
        raise bad("kv_page", "a KV-cache call is a dense batch (lengths on the device); "
                  "not with seqlens")  # fmt: skip
    patterns = entry.kv_lengths or ["full"]
    return [dataclasses.replace(t, kv_page=p, kv_lengths=lengths)
            for t in targets for p in entry.kv_page for lengths in patterns]  # fmt: skip


def _plain_targets(
    path: Path, index: int, entry: Entry, bad: Callable[[str, str], WorkloadError]
) -> list[Target]:
    if entry.seqlens is not None:
        return _varlen_targets(entry, label=entry.label or f"entry {index}", bad=bad)
    if entry.n is not None and (entry.nq is not None or entry.nk is not None):
        raise bad("n", "give either n (Nq = Nk) or nq (and nk), not both")
    if entry.n is None and entry.nq is None:
        raise bad("nk" if entry.nk is not None else "n", "needs n, or nq (and an optional nk)")
    kv_heads = entry.kv_heads if entry.kv_heads is not None else entry.heads
    if entry.heads % kv_heads:
        raise bad("kv_heads", f"heads ({entry.heads}) must be a multiple of kv_heads ({kv_heads})")
    if entry.nq is not None and entry.nk is not None:
        lengths = list(product(entry.nq, entry.nk))
    else:
        squares = entry.nq if entry.nq is not None else entry.n
        assert squares is not None
        lengths = [(n, n) for n in squares]
    label = entry.label or f"entry {index}"
    targets = []
    for dtype, causal, batch, (nq, nk) in product(entry.dtype, entry.causal, entry.batch, lengths):
        try:
            shape = Shape(nq=nq, nk=nk, batch=batch, heads=entry.heads, kv_heads=kv_heads)
        except ShapeError as exc:  # the checks above cover it; kept for a clear message
            raise bad("shape", str(exc)) from None
        targets.append(Target(d=entry.d, dtype=dtype, causal=causal, shape=shape, label=label))
    return targets


def _varlen_targets(
    entry: Entry, *, label: str, bad: Callable[[str, str], WorkloadError]
) -> list[Target]:
    if entry.n is not None or entry.nq is not None or entry.nk is not None:
        raise bad("seqlens", "give seqlens or lengths (n, nq, nk), not both")
    if "batch" in entry.model_fields_set:
        raise bad("batch", "a seqlens entry's batch is the number of lengths; leave it out")
    kv_heads = entry.kv_heads if entry.kv_heads is not None else entry.heads
    if entry.heads % kv_heads:
        raise bad("kv_heads", f"heads ({entry.heads}) must be a multiple of kv_heads ({kv_heads})")
    targets = []
    for dtype, causal, lens in product(entry.dtype, entry.causal, entry.seqlens or []):
        shape = Shape(max(lens), max(lens), len(lens), entry.heads, kv_heads)
        targets.append(Target(entry.d, dtype, causal, shape, label=label, seqlens=tuple(lens)))
    return targets


def load_workload(path: Path) -> Workload:
    """Read and validate a workload file.

    Raises:
        WorkloadError: a missing or unreadable file, an unknown extension, bad syntax, or an
            entry that is not valid (the message names the file, the entry and the field).
    """
    data = _read(path)
    name: str | None = None
    if isinstance(data, dict):
        try:
            top = _File.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = str(err["loc"][0]) if err["loc"] else "file"
            kind = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            raise WorkloadError(f"{path}: {where!r}: {kind}") from None
        name, entries = top.name, top.shapes
    elif isinstance(data, list):
        entries = data
    else:
        raise WorkloadError(f"{path}: expected a list of entries or a mapping with 'shapes:'")
    if not entries:
        raise WorkloadError(f"{path}: no entries")
    targets: list[Target] = []
    # Entries are numbered from 1, as a reader counts them in the file.
    for index, raw in enumerate(entries, start=1):
        if not isinstance(raw, dict):
            raise WorkloadError(f"{path}: entry {index}: expected a mapping, got {raw!r}")
        try:
            entry = Entry.model_validate(raw)
        except ValidationError as exc:
            raise _field_error(path, index, exc) from None
        targets.extend(_entry_targets(path, index, entry))
    unique = tuple(dict.fromkeys(targets))
    log.debug("workload %s: %d entries, %d problems", path, len(entries), len(unique))
    return Workload(path=path, name=name, targets=unique)


def unique_targets(groups: Iterable[Sequence[Target]]) -> list[Target]:
    """The targets of every group in order, each once (the first label wins)."""
    return list(dict.fromkeys(t for group in groups for t in group))
