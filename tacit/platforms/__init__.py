"""Pick the Platform for a device string ("cpu", "cuda", "auto")."""

from __future__ import annotations

from tacit.platforms.cpu import CpuPlatform
from tacit.platforms.cuda import CudaPlatform
from tacit.platforms.interface import Platform

_PLATFORMS: dict[str, type[Platform]] = {"cpu": CpuPlatform, "cuda": CudaPlatform}


def get_platform(device: str = "auto") -> Platform:
    if device == "auto":
        cuda = CudaPlatform()
        return cuda if cuda.is_available() else CpuPlatform()
    kind, sep, index_text = device.partition(":")
    if kind not in _PLATFORMS:
        raise ValueError(f"device={device!r} is not supported; valid: auto, {', '.join(_PLATFORMS)}")
    if sep and not (index_text.isdigit() and index_text.isascii()):
        raise ValueError(f"device={device!r}: the index after ':' must be a number, e.g. {kind}:0")
    platform = _PLATFORMS[kind]()
    if not platform.is_available():
        raise ValueError(f"device={device!r} was asked for but is not available on this machine")
    if sep:  # an index is honoured or refused, never dropped
        platform.set_index(int(index_text), device)
    return platform


__all__ = ["Platform", "get_platform"]
