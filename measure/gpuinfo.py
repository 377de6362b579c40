"""Provenance of the GPU a measurement is taken on (:class:`~core.records.GpuInfo`).

Everything is read, nothing is changed: fa2tune never sets clocks or power limits. Clocks are
recorded as found (they tell a later reader whether the GPU was boosting or throttled).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence

from core.records import GpuInfo

log = logging.getLogger(__name__)

_SMI_FIELDS = ("driver_version", "clocks.sm", "clocks.mem")


def parse_smi_csv(text: str, fields: Sequence[str] = _SMI_FIELDS) -> dict[str, str | None]:
    """Parse one line of ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``.

    Values such as ``[N/A]``, ``N/A`` or ``[Not Supported]`` become ``None``.

    Raises:
        ValueError: when the line does not have one value per field.
    """
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        raise ValueError("nvidia-smi printed nothing")
    values = [v.strip() for v in lines[0].split(",")]
    if len(values) != len(fields):
        raise ValueError(f"expected {len(fields)} values, got {values!r}")
    out: dict[str, str | None] = {}
    for f, v in zip(fields, values, strict=True):
        bare = v.strip("[]").strip().lower()
        out[f] = None if bare in ("n/a", "not supported", "unknown error", "") else v
    return out


def _to_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value.split()[0]))
    except (ValueError, IndexError):
        return None


def query_nvidia_smi(target: str, timeout_s: float = 10.0) -> dict[str, str | None] | None:
    """Driver version and current clocks of one GPU from ``nvidia-smi``.

    Args:
        target: what ``nvidia-smi -i`` accepts: PCI bus id, UUID or index.
        timeout_s: give up after this long.

    Returns:
        The parsed fields, or ``None`` when nvidia-smi is absent or fails.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [
        exe,
        f"--query-gpu={','.join(_SMI_FIELDS)}",
        "--format=csv,noheader,nounits",
        "-i",
        target,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("nvidia-smi failed: %s", exc)
        return None
    if proc.returncode != 0:
        log.debug("nvidia-smi exit %d: %s", proc.returncode, proc.stderr.strip())
        return None
    try:
        return parse_smi_csv(proc.stdout)
    except ValueError as exc:
        log.debug("nvidia-smi output not understood: %s", exc)
        return None


def format_driver_api_version(version: int) -> str:
    """``cuDriverGetVersion``'s integer (e.g. 13000) as ``"13.0"``."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def current_gpu_info(device: int | None = None) -> GpuInfo:
    """Describe CUDA device ``device`` (torch's index; the current device when ``None``).

    ``driver_version`` is the NVIDIA driver release from nvidia-smi (e.g. ``"570.86.15"``) when
    nvidia-smi answers, else the driver API version from ``cuDriverGetVersion`` (e.g.
    ``"13.0"``). ``cuda_version`` is the CUDA runtime torch was built with. Clocks are the
    current SM and memory clocks in MHz from nvidia-smi, ``None`` when unavailable.

    Raises:
        RuntimeError: when torch has no usable CUDA device.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is available to torch")
    dev = torch.cuda.current_device() if device is None else device
    props = torch.cuda.get_device_properties(dev)
    cuda_version = str(torch.version.cuda or "unknown")

    driver_api: str | None = None
    smem_optin = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
    smi_target = str(dev)
    try:
        from measure.loader import call, driver

        cu = driver()
        call("cuInit", 0)
        driver_api = format_driver_api_version(int(call("cuDriverGetVersion")))
        cu_dev = call("cuDeviceGet", dev)
        attr = cu.CUdevice_attribute
        smem_optin = int(
            call(
                "cuDeviceGetAttribute",
                attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                cu_dev,
            )
        )
        l2_bytes = int(call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, cu_dev))
        # nvidia-smi numbers devices its own way; the PCI bus id names the same device in both.
        bus = call("cuDeviceGetPCIBusId", 32, cu_dev)
        bus_id = bus.decode() if isinstance(bus, bytes) else str(bus)
        smi_target = bus_id.split("\x00", 1)[0].strip() or smi_target
    except Exception as exc:  # cuda-bindings missing or an old driver: torch's figures suffice
        log.debug("driver queries failed: %s", exc)

    smi = query_nvidia_smi(smi_target) or {}
    driver_version = smi.get("driver_version") or driver_api or "unknown"
    return GpuInfo(
        name=str(props.name),
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=int(props.multi_processor_count),
        driver_version=str(driver_version),
        cuda_version=cuda_version,
        memory_bytes=int(props.total_memory),
        smem_optin_bytes=smem_optin,
        l2_bytes=l2_bytes,
        sm_clock_mhz=_to_int(smi.get("clocks.sm")),
        mem_clock_mhz=_to_int(smi.get("clocks.mem")),
    )


def arch_for(info: GpuInfo) -> str | None:
    """The plain target to build for the device (``"sm_90"`` for compute capability 9.0; the
    newest lower one of its major version where fa2tune has none of its own, logged), None
    where fa2tune has no code the device runs (:func:`codegen.targets.target_for`)."""
    from codegen.targets import target_for

    return target_for(info.compute_capability)


def describe_limits(info: GpuInfo, target: str) -> str:
    """One line for a campaign's log: the limits read from the device that bound its space,
    and where the table of ``target`` (what builds ahead of time assume) says otherwise."""
    from codegen.targets import TARGETS

    line = (
        f"{info.name} (compute capability {info.compute_capability}, {target} code): "
        f"{info.sm_count} SMs, {info.smem_optin_bytes // 1024} KB shared memory per block, "
        f"{info.l2_bytes / 2**20:.0f} MB L2, read from the device"
    )
    facts = TARGETS.get(target.rstrip("a"))
    read = info.smem_optin_bytes
    if facts is not None and read and read != facts.smem_per_block:
        line += (
            f"; the {facts.arch} table says {facts.smem_per_block // 1024} KB, and the space "
            "keeps to the smaller"
        )
    return line
