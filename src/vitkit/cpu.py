"""What this CPU can do, as the fast path's rules and the int8 kernels ask it: its bf16 matrix instructions.

torch's own probes (``torch.cpu._is_amx_tile_supported``, ``_is_avx512_bf16_supported``) answer; a probe
that is missing or fails means no. Benchmark results are filed by the answer (``cpu_bf16_kind``).
"""

from __future__ import annotations

import torch


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
    """This CPU's bf16 matrix instructions, as benchmark results are filed: 'amx', 'avx512bf16' or 'none'."""
    if _cpu_probe("_is_amx_tile_supported"):
        return "amx"
    return "avx512bf16" if _cpu_probe("_is_avx512_bf16_supported") else "none"


__all__ = ["cpu_bf16_kind", "cpu_has_fast_bf16"]
