"""The hardware as the library asks it: the device a name means (``resolve_device``), the CPUs this
process may use, glibc's allocator setting, and what this CPU can do: its bf16 matrix instructions.

torch's own probes (``torch.cpu._is_amx_tile_supported``, ``_is_avx512_bf16_supported``) answer; a probe
that is missing or fails means no. Benchmark results are filed by the answer (``cpu_bf16_kind``).
"""

from __future__ import annotations

import os

import torch

from .errors import ConfigError


def _cpu_probe(name: str) -> bool:
    """One of torch.cpu's feature probes ('_is_amx_tile_supported', ...); missing or failing means no."""
    fn = getattr(getattr(torch, "cpu", None), name, None)
    try:
        return bool(fn is not None and fn())
    except Exception:  # noqa: BLE001 - a probe that fails means "no"
        return False


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with bf16 matrix instructions (AMX or AVX512-BF16), where bf16 can beat fp32."""
    return cpu_bf16_kind() != "none"


def cpu_bf16_kind() -> str:
    """This CPU's bf16 matrix instructions, as benchmark results are filed: 'amx', 'avx512bf16' or 'none'.
    'none' too where torch's kernels are held below AVX-512 (``torch.backends.cpu.get_cpu_capability()``:
    an AVX2-only CPU, or ATEN_CPU_CAPABILITY=avx2 emulating one), whatever the CPU itself has."""
    if not cpu_capability().startswith("AVX512"):
        return "none"
    if _cpu_probe("_is_amx_tile_supported"):
        return "amx"
    return "avx512bf16" if _cpu_probe("_is_avx512_bf16_supported") else "none"


def cpu_capability() -> str:
    """The instruction set torch's CPU kernels run with ('AVX2', 'AVX512', 'DEFAULT', ...): benchmark rows
    record it beside their figures."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # pragma: no cover - a torch without the probe
        return "unknown"


def load_average() -> float:
    """The CPUs' 1-minute load average (0 where the platform has none): how much other work competes for
    them."""
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - no load average on this platform
        return 0.0


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str | torch.device = "auto", *, local_rank: int = 0, what: str = "device") -> torch.device:
    """``name`` as an available torch.device; a malformed or unavailable one is a one-line ConfigError.

    'auto' is CUDA (this process's local GPU, ``local_rank``), else MPS, else the CPU. A bare 'cuda'
    is also this process's local GPU. ``what`` names the argument in the error ('device', '--device').
    """
    if isinstance(name, str) and name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{what}: {str(name)!r} is not a device (auto, cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{what}: {str(name)!r} was asked for but no CUDA GPU is available")
        count = torch.cuda.device_count()
        if dev.index is None:
            return torch.device("cuda", local_rank % count)
        if dev.index >= count:
            raise ConfigError(f"{what}: {str(name)!r}: this machine has {count} CUDA GPU(s)")
    elif dev.type == "mps" and not _mps_available():
        raise ConfigError(f"{what}: {str(name)!r} was asked for but MPS is not available")
    return dev


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# glibc's mallopt parameters, and the size below which freed memory stays in the process (both ways)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Have glibc's allocator keep freed memory for reuse: blocks up to ``KEEP_FREED_BYTES`` come from
    the heap rather than from fresh mappings, and the heap is not trimmed below that. By default glibc
    maps large blocks afresh and returns them when freed, so every forward pays page faults and zeroing
    for the same few activation sizes again. Measured by benchmarks/allocator.py ->
    benchmarks/results/allocator.jsonl (the figures: docs/performance.md). It acts on the whole process,
    so the command line calls it, not the library. True where it applied (glibc); False elsewhere."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a libc without mallopt
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))


__all__ = ["cpu_bf16_kind", "cpu_capability", "load_average", "cpu_has_fast_bf16", "resolve_device", "usable_cpus", "keep_freed_memory"]
