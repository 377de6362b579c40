"""The element types a kernel computes in, and every spelling of them the project uses.

One table, so that the config name (``fp16``), the CUDA type in a rendered instantiation or the
exported header (``__half``), the torch dtype of the measurement inputs (``torch.float16``) and
the header's enum constant (``FA2TUNE_FP16``) cannot drift apart. Imports nothing of the
project and not torch: the torch side is the attribute *name*, looked up where torch is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnknownElementError(ValueError):
    """A dtype name that is not one of :data:`ELEMENTS`."""


@dataclass(frozen=True)
class Element:
    """One element type under all its names.

    Attributes:
        name: the config and database spelling, e.g. ``"fp16"``.
        cuda_type: the CUDA C++ type, e.g. ``"__half"``.
        torch_name: the attribute of the ``torch`` module, e.g. ``"float16"``.
        header_enum: the exported header's ``fa2tune_dtype`` constant, e.g. ``"FA2TUNE_FP16"``
            (its numeric value is fixed in codegen/templates/dispatch.cuh).
    """

    name: str
    cuda_type: str
    torch_name: str
    header_enum: str


ELEMENTS: dict[str, Element] = {
    e.name: e
    for e in (
        Element("fp16", "__half", "float16", "FA2TUNE_FP16"),
        Element("bf16", "__nv_bfloat16", "bfloat16", "FA2TUNE_BF16"),
    )
}


def element(name: str) -> Element:
    """The element type called ``name`` (``"fp16"`` or ``"bf16"``).

    Raises:
        UnknownElementError: for any other name (a :class:`ValueError`).
    """
    try:
        return ELEMENTS[name]
    except KeyError:
        raise UnknownElementError(
            f"unknown dtype {name!r}; expected one of {list(ELEMENTS)}"
        ) from None


def cuda_type(name: str) -> str:
    """The CUDA type of a dtype name (``"fp16"`` -> ``"__half"``).

    Raises:
        UnknownElementError: for an unknown dtype (a :class:`ValueError`).
    """
    return element(name).cuda_type
