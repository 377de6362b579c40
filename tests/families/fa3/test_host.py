"""The fa3 family's host side without a GPU: TMA descriptor arguments and launch packing.

A stub driver stands in for cuda-bindings (and a stub torch where the descriptor encoder
imports it), so these run on CPU machines: what ``cuTensorMapEncodeTiled`` is asked for, the
family registry's geometry and ``host_prep`` resolution, and the ``void*`` array
``cuLaunchKernel`` receives (the ``FaParams`` struct, then the three 128-byte tensor maps).
"""

from __future__ import annotations

import ctypes
import sys
import types
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

import codegen.families.fa3.host as tma
from codegen.families.fa3.host import TENSOR_MAP_BYTES, TensorMap, dims_and_strides, fa3_tensor_maps
from core.fa2_config import Fa2Config
from core.fa3_config import Fa3Config
from core.problem import Problem
from measure.loader import BoundLaunch, extra_args, grid_for, host_prep, launch_geometry
from measure.params import FaParams

FA2 = Fa2Config.from_name("fa2_d128_fp16_full_br128_bc64_w4_s1_pad8")
FA3 = Fa3Config(128, "fp16", False)  # 128 x 128, two consumer warpgroups
FA3_M192 = Fa3Config(64, "bf16", True, block_m=192, block_n=160, pv_regs=False,
                     pingpong=False, consumer_regs=160)  # fmt: skip


@dataclass
class FakeTensor:
    """What the host side reads from a torch tensor: shape, strides, dtype, pointer."""

    shape: tuple[int, ...]
    dtype: Any = "torch.float16"
    ptr: int = 0x7F0000000000
    strides: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.strides:
            acc, out = 1, []
            for n in reversed(self.shape):
                out.append(acc)
                acc *= n
            self.strides = tuple(reversed(out))

    def stride(self, dim: int | None = None) -> Any:
        return self.strides if dim is None else self.strides[dim]

    def dim(self) -> int:
        return len(self.shape)

    def element_size(self) -> int:
        return 2

    def data_ptr(self) -> int:
        return self.ptr


# ------------------------------------------------------------------------------------------
# dims and strides


def test_dims_and_strides_both_layouts() -> None:
    # [B=2, N=300, H=4, D=128] contiguous: row 4*128 elements, head 128, batch 300*4*128.
    dims, strides = dims_and_strides((2, 300, 4, 128), (153600, 512, 128, 1), 2, "bnhd")
    assert dims == [128, 300, 4, 2]
    assert strides == [1024, 256, 307200]
    # [B=2, H=4, N=300, D=128] contiguous: row 128, head 300*128, batch 4*300*128.
    dims, strides = dims_and_strides((2, 4, 300, 128), (153600, 38400, 128, 1), 2, "bhnd")
    assert dims == [128, 300, 4, 2]
    assert strides == [256, 76800, 307200]


def test_dims_and_strides_padded_rows() -> None:
    # A view of D=96 out of rows of 104 elements: the tensor's own strides are used.
    dims, strides = dims_and_strides((1, 77, 3, 96), (77 * 3 * 104, 3 * 104, 104, 1), 2, "bnhd")
    assert dims == [96, 77, 3, 1]
    assert strides[0] == 3 * 104 * 2 and strides[1] == 104 * 2


def test_extent_one_dims_get_a_valid_stride() -> None:
    # N=1, H=1, B=1: torch may report any stride there; TMA needs 16-byte multiples.
    dims, strides = dims_and_strides((1, 1, 1, 64), (7, 3, 5, 1), 2, "bnhd")
    assert dims == [64, 1, 1, 1]
    assert strides == [128, 128, 128]
    assert all(s % 16 == 0 and s > 0 for s in strides)
    # D=96, N=1: the row stride rounds 192 bytes (already a multiple of 16).
    _, strides = dims_and_strides((2, 8, 1, 96), (768, 96, 96, 1), 2, "bhnd")
    assert strides == [192, 192, 1536]


# ------------------------------------------------------------------------------------------
# cuTensorMapEncodeTiled's arguments (stub driver and torch)


class _Enum:
    def __getattr__(self, name: str) -> str:
        return name


class FakeDriver(types.SimpleNamespace):
    pass


def _fake_driver() -> Any:
    return FakeDriver(
        CUtensorMapDataType=_Enum(),
        CUtensorMapInterleave=_Enum(),
        CUtensorMapSwizzle=_Enum(),
        CUtensorMapL2promotion=_Enum(),
        CUtensorMapFloatOOBfill=_Enum(),
        cuuint64_t=int,
        cuuint32_t=int,
    )


@pytest.fixture
def stub_encoder(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Record cuTensorMapEncodeTiled calls; each returns 128 bytes tagged with its call index."""
    calls: list[tuple[Any, ...]] = []
    keep: list[Any] = []

    def call(name: str, *args: Any) -> Any:
        assert name == "cuTensorMapEncodeTiled"
        calls.append(args)
        raw = (ctypes.c_uint8 * TENSOR_MAP_BYTES)(*([len(calls)] * TENSOR_MAP_BYTES))
        keep.append(raw)
        return types.SimpleNamespace(getPtr=lambda: ctypes.addressof(raw))

    fake_torch = types.ModuleType("torch")
    fake_torch.float16 = "torch.float16"  # type: ignore[attr-defined]
    fake_torch.bfloat16 = "torch.bfloat16"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(tma, "driver", _fake_driver)
    monkeypatch.setattr(tma, "call", call)
    return calls


def test_fa3_tensor_maps_encode_q_k_v(stub_encoder: list[tuple[Any, ...]]) -> None:
    q = FakeTensor((2, 300, 8, 128), ptr=0x10000)
    k = FakeTensor((2, 1000, 2, 128), ptr=0x20000)
    v = FakeTensor((2, 1000, 2, 128), ptr=0x30000)
    maps = fa3_tensor_maps(FA3, q, k, v, "bnhd")  # type: ignore[arg-type]
    assert len(maps) == 3 and all(isinstance(m, TensorMap) for m in maps)
    # Each map is a copy of what the driver wrote, in order q, k, v.
    assert [bytes(m)[0] for m in maps] == [1, 2, 3]
    assert all(len(bytes(m)) == TENSOR_MAP_BYTES for m in maps)
    (cq, ck, cv) = stub_encoder
    for c, t, rows in ((cq, q, 128), (ck, k, 128), (cv, v, 128)):
        dtype, rank, ptr, dims, strides, box, elem_strides, *modes = c
        assert dtype == "CU_TENSOR_MAP_DATA_TYPE_FLOAT16" and rank == 4 and ptr == t.ptr
        assert dims == [128, t.shape[1], t.shape[2], 2]
        assert strides == [t.shape[2] * 128 * 2, 128 * 2, t.shape[1] * t.shape[2] * 128 * 2]
        assert box == [64, rows, 1, 1] and elem_strides == [1, 1, 1, 1]
        assert modes == [
            "CU_TENSOR_MAP_INTERLEAVE_NONE",
            "CU_TENSOR_MAP_SWIZZLE_128B",
            "CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
            "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",  # out-of-bounds elements read as zeros
        ]


def test_fa3_boxes_follow_block_m_and_block_n(stub_encoder: list[tuple[Any, ...]]) -> None:
    q = FakeTensor((1, 4, 100, 64), dtype="torch.bfloat16")
    kv = FakeTensor((1, 1, 700, 64), dtype="torch.bfloat16")
    fa3_tensor_maps(FA3_M192, q, kv, kv, "bhnd")  # type: ignore[arg-type]
    assert [c[5] for c in stub_encoder] == [[64, 192, 1, 1], [64, 160, 1, 1], [64, 160, 1, 1]]
    assert stub_encoder[0][0] == "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"
    assert stub_encoder[0][4] == [128, 100 * 128, 4 * 100 * 128]


def test_fa3_tensor_maps_refuse_mismatches(stub_encoder: list[tuple[Any, ...]]) -> None:
    good = FakeTensor((1, 64, 2, 128))
    with pytest.raises(ValueError, match="D=128"):
        fa3_tensor_maps(FA3, FakeTensor((1, 64, 2, 64)), good, good, "bnhd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float16"):
        bf = FakeTensor((1, 64, 2, 128), dtype="torch.bfloat16")
        fa3_tensor_maps(FA3, good, bf, good, "bnhd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="16-byte"):
        fa3_tensor_maps(FA3, FakeTensor((1, 64, 2, 128), ptr=0x10008), good, good, "bnhd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="contiguous"):
        odd = FakeTensor((1, 64, 2, 128), strides=(2 * 64 * 256, 512, 256, 2))
        fa3_tensor_maps(FA3, odd, good, good, "bnhd")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        fa3_tensor_maps(FA2, good, good, good, "bnhd")  # type: ignore[arg-type]
    assert stub_encoder == []  # nothing reached the driver


@dataclass
class FakePacked(FakeTensor):
    """A packed ``[total, heads, D]`` tensor; ``unsqueeze(0)`` views it as one batch."""

    def unsqueeze(self, dim: int) -> FakeTensor:
        assert dim == 0
        batch = self.shape[0] * self.strides[0]
        return FakeTensor((1, *self.shape), self.dtype, self.ptr, (batch, *self.strides))


def test_fa3_varlen_tensor_maps_are_over_the_packed_rows(
    stub_encoder: list[tuple[Any, ...]],
) -> None:
    from codegen.families.fa3.host import fa3_varlen_tensor_maps

    vl = replace(FA3_M192, varlen=True)
    q = FakePacked((1455, 8, 64), dtype="torch.bfloat16", ptr=0x10000)
    kv = FakePacked((2045, 2, 64), dtype="torch.bfloat16", ptr=0x20000)
    maps = fa3_varlen_tensor_maps(vl, q, kv, kv)  # type: ignore[arg-type]
    assert [bytes(m)[0] for m in maps] == [1, 2, 3]
    (cq, ck, _) = stub_encoder
    # (D, total, H, 1): the sequences' offsets go into the row coordinate, batch 0.
    assert cq[3] == [64, 1455, 8, 1] and ck[3] == [64, 2045, 2, 1]
    assert cq[4][:2] == [8 * 64 * 2, 64 * 2] and ck[4][:2] == [2 * 64 * 2, 64 * 2]
    assert [c[5] for c in stub_encoder] == [[64, 192, 1, 1], [64, 160, 1, 1], [64, 160, 1, 1]]


def test_varlen_and_dense_descriptors_refuse_each_others_configs(
    stub_encoder: list[tuple[Any, ...]],
) -> None:
    from codegen.families.fa3.host import fa3_varlen_tensor_maps

    packed = FakePacked((64, 2, 128))
    with pytest.raises(ValueError, match="varlen"):
        good = FakeTensor((1, 64, 2, 128))
        fa3_tensor_maps(replace(FA3, varlen=True), good, good, good, "bnhd")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="_vl"):
        fa3_varlen_tensor_maps(FA3, packed, packed, packed)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="packed"):
        four = FakeTensor((1, 64, 2, 128))
        fa3_varlen_tensor_maps(replace(FA3, varlen=True), four, packed, packed)  # type: ignore[arg-type]
    assert stub_encoder == []


def test_packed_launch_takes_the_varlen_descriptors(stub_encoder: list[tuple[Any, ...]]) -> None:
    """The loader's packed mode asks the family's registry entry (varlen_host_prep) for the
    packed tensors' arguments: the very descriptors fa3_varlen_tensor_maps encodes."""
    from codegen.families.fa3.host import fa3_varlen_tensor_maps
    from measure.loader import packed_extra_args

    vl = replace(FA3_M192, varlen=True)
    q = FakePacked((1455, 8, 64), dtype="torch.bfloat16", ptr=0x10000)
    kv = FakePacked((2045, 2, 64), dtype="torch.bfloat16", ptr=0x20000)
    maps = packed_extra_args(vl, q, kv, kv)  # type: ignore[arg-type]
    assert [bytes(m)[0] for m in maps] == [1, 2, 3]
    fa3_varlen_tensor_maps(vl, q, kv, kv)  # type: ignore[arg-type]
    assert stub_encoder[:3] == stub_encoder[3:]  # the same dims, strides and boxes
    assert packed_extra_args(replace(FA2, varlen=True), q, kv, kv) == ()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="packed"):
        packed_extra_args(vl, FakeTensor((1, 64, 2, 64)), kv, kv)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# The family registry in the loader


def test_geometry_comes_from_the_family() -> None:
    # fa2: unchanged (ceil(n / br) tiles, 32 * warps threads).
    assert grid_for(FA2, Problem(gpu="g", d=128, n=1000, batch=3, heads=5)) == (
        (8, 5, 3),
        (128, 1, 1),
    )
    # fa3: ceil(nq / block_m) tiles, one producer + block_m / 64 consumer warpgroups.
    assert launch_geometry(FA3, 1000, 5, 3) == ((8, 5, 3), (384, 1, 1))
    assert launch_geometry(FA3_M192, 1, 32, 1) == ((1, 32, 1), (512, 1, 1))
    assert launch_geometry(FA3_M192, 385, 2, 2) == ((3, 2, 2), (512, 1, 1))


def test_host_prep_resolved_per_family() -> None:
    assert host_prep("fa2") is None
    assert host_prep("fa3") is fa3_tensor_maps
    assert host_prep("fa3") is host_prep("fa3")  # cached
    # fa2 launches take only the params: no torch, nothing called.
    assert extra_args(FA2, None, None, None, "bnhd") == ()  # type: ignore[arg-type]


def test_extra_args_of_fa3_are_its_tensor_maps(stub_encoder: list[tuple[Any, ...]]) -> None:
    t = FakeTensor((1, 64, 2, 128))
    extra = extra_args(FA3, t, t, t, "bnhd")  # type: ignore[arg-type]
    assert len(extra) == 3 and len(stub_encoder) == 3


# ------------------------------------------------------------------------------------------
# Argument packing: what cuLaunchKernel receives


class FakeLaunchDriver:
    """Records cuLaunchKernel's geometry and reads back the argument array it is given."""

    def __init__(self, n_args: int) -> None:
        self.n_args = n_args
        self.launches: list[tuple[Any, ...]] = []

    def CUstream(self, handle: int) -> int:
        return handle

    def cuLaunchKernel(self, fn: Any, *rest: Any) -> tuple[int]:
        *geometry, stream, args_addr, extra = rest
        ptrs = (ctypes.c_void_p * self.n_args).from_address(args_addr)
        self.launches.append((fn, tuple(geometry), stream, [int(p or 0) for p in ptrs], extra))
        return (0,)


def _params() -> FaParams:
    return FaParams(0x1000, 0x2000, 0x3000, 0x4000, None, *range(1, 13), 2, 8, 2, 300, 1000,
                     0.088)  # fmt: skip


def test_fa2_launch_passes_only_the_params() -> None:
    cu = FakeLaunchDriver(1)
    params = _params()
    launch = BoundLaunch(cu, "fn", "sym", params, (3, 8, 2), (128, 1, 1), 4096, 77)
    launch()
    ((fn, geometry, stream, ptrs, extra),) = cu.launches
    assert (fn, geometry, stream, extra) == ("fn", (3, 8, 2, 128, 1, 1, 4096), 77, 0)
    assert ptrs == [ctypes.addressof(params)]
    assert len(launch._args) == 1  # the fa2 ABI: one argument


def test_fa3_launch_packs_params_then_three_tensor_maps() -> None:
    params = _params()
    maps = []
    for tag in (0xA1, 0xB2, 0xC3):
        m = TensorMap()
        ctypes.memset(ctypes.addressof(m), tag, TENSOR_MAP_BYTES)
        maps.append(m)
    cu = FakeLaunchDriver(4)
    grid, block = launch_geometry(FA3, 300, 8, 2)
    launch = BoundLaunch(cu, "fn", FA3.name, params, grid, block, FA3.smem_bytes, 5, maps)
    del maps  # the launcher keeps its arguments alive
    launch()
    launch()  # a bound launch is reusable (timing loops)
    assert len(cu.launches) == 2
    _, geometry, _, ptrs, _ = cu.launches[0]
    assert geometry == (3, 8, 2, 384, 1, 1, FA3.smem_bytes)
    assert ptrs[0] == ctypes.addressof(launch.params)
    assert ctypes.string_at(ptrs[0], ctypes.sizeof(FaParams)) == bytes(params)
    for ptr, tag in zip(ptrs[1:], (0xA1, 0xB2, 0xC3), strict=True):
        assert ctypes.string_at(ptr, TENSOR_MAP_BYTES) == bytes([tag]) * TENSOR_MAP_BYTES
    assert len(set(ptrs)) == 4


def test_launch_refusal_names_the_kernel() -> None:
    from measure.loader import CudaError

    class Refusing(FakeLaunchDriver):
        def cuLaunchKernel(self, fn: Any, *rest: Any) -> tuple[int]:
            return (1,)

        def cuGetErrorName(self, err: Any) -> tuple[int, bytes]:
            return (0, b"CUDA_ERROR_INVALID_VALUE")

    launch = BoundLaunch(Refusing(4), "fn", FA3.name, _params(), (1, 1, 1), (384, 1, 1), 0, 0,
                         [TensorMap(), TensorMap(), TensorMap()])  # fmt: skip
    with pytest.raises(CudaError, match=FA3.name):
        launch()
