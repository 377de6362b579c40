"""core.elements: one map of element types, used by rendering, export and measurement."""

from __future__ import annotations

import pytest

from codegen.render import cuda_elem_type
from core.config import DTYPES
from core.elements import ELEMENTS, UnknownElementError, cuda_type, element


def test_every_config_dtype_has_one_element() -> None:
    assert tuple(ELEMENTS) == DTYPES
    assert [cuda_type(t) for t in DTYPES] == ["__half", "__nv_bfloat16"]
    assert [element(t).torch_name for t in DTYPES] == ["float16", "bfloat16"]
    assert [element(t).header_enum for t in DTYPES] == ["FA2TUNE_FP16", "FA2TUNE_BF16"]
    assert all(cuda_elem_type(t) == cuda_type(t) for t in DTYPES)


def test_unknown_dtype_is_a_value_error() -> None:
    with pytest.raises(UnknownElementError, match="unknown dtype 'fp8'"):
        element("fp8")
    with pytest.raises(ValueError):
        cuda_type("float16")


def test_header_enum_values_match_the_dispatch_template() -> None:
    from codegen.export import DISPATCH_TEMPLATE, TEMPLATE_DIR

    text = (TEMPLATE_DIR / DISPATCH_TEMPLATE).read_text()
    enum = "enum fa2tune_dtype : int { " + ", ".join(
        f"{element(t).header_enum} = {i}" for i, t in enumerate(DTYPES)
    )
    assert enum + " };" in text
