"""The CUDA driver through cuda-bindings: calls whose errors raise :class:`CudaError`.

Used by the GPU stage (:mod:`measure.loader` re-exports these names) and by the families'
host preparations (codegen/families/*/host.py), which encode launch arguments such as TMA
descriptors. cuda-bindings is imported on the first call, never at module import time.
"""

from __future__ import annotations

from functools import cache
from typing import Any

#: Errors after which the CUDA context is unusable: the process must go.
STICKY_ERRORS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    }
)


class CudaError(RuntimeError):
    """A CUDA driver call returned an error.

    Attributes:
        call: the driver function, e.g. ``"cuLaunchKernel"``.
        code: the numeric ``CUresult``.
        name: its name, e.g. ``"CUDA_ERROR_ILLEGAL_ADDRESS"``.
    """

    def __init__(self, call: str, code: int, name: str, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.name = name
        msg = f"{call} failed: {name} ({code})"
        super().__init__(f"{msg}: {detail}" if detail else msg)

    @property
    def sticky(self) -> bool:
        """True when the error leaves the context unusable (trap, illegal address, ...)."""
        return self.name in STICKY_ERRORS


@cache
def driver() -> Any:
    """The ``cuda.bindings.driver`` module (``cuda.cuda`` for older cuda-python).

    Raises:
        ImportError: when cuda-python is not installed.
    """
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu  # cuda-python < 12.6 layout
        except ImportError as exc:
            raise ImportError(
                "cuda-bindings is required for kernel loading (pip install 'fa2tune[gpu]')"
            ) from exc
    return cu


def error_name(cu: Any, err: Any) -> str:
    try:
        res, name = cu.cuGetErrorName(err)
        if int(res) == 0 and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # naming the error must never hide it
        pass
    return getattr(err, "name", str(err))


def check(call: str, result: tuple[Any, ...]) -> Any:
    """Unwrap a cuda-python result tuple ``(CUresult, *values)``.

    Returns:
        ``None`` for no values, the value for one, the tuple of values otherwise.

    Raises:
        CudaError: when the ``CUresult`` is not ``CUDA_SUCCESS``.
    """
    err, *values = result
    if int(err) != 0:
        cu = driver()
        raise CudaError(call, int(err), error_name(cu, err))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def call(name: str, *args: Any) -> Any:
    """Call driver function ``name`` and check its result (see :func:`check`)."""
    return check(name, getattr(driver(), name)(*args))


__all__ = ["STICKY_ERRORS", "CudaError", "call", "check", "driver", "error_name"]
