"""Where each model of a set loads: one device and one dtype per model (`--devices`, `--dtype`).

`LoadOptions.device` and `.dtype` hold one value for every model or one per model. A device left at
"auto" goes, when the machine has several GPUs, to the GPU holding the fewest parameters so far (the
largest model first), so two 7B models land on two GPUs; with one GPU or none, "auto" is `pick_device`'s
choice (cuda, mps, cpu). Bad values fail here, before minutes of loading.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..contract.errors import ModelLoadError
from .loading import LoadOptions, parameter_count, pick_device, pick_dtype
from .specs import scheme_of


def per_model(value: str | Sequence[str], count: int, what: str) -> list[str]:
    """One value for each of `count` models: a single value applies to all."""
    values = [value] if isinstance(value, str) else list(value)
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise ModelLoadError(f"give one {what} for all models or one per model ({count}), not {len(values)}")
    return values


def spread(sizes: Sequence[int], gpus: int) -> list[str]:
    """A CUDA device per model: the largest first, each to the GPU with the fewest parameters so far."""
    load = [0] * gpus
    out = [""] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        gpu = min(range(gpus), key=lambda g: (load[g], g))
        load[gpu] += sizes[i]
        out[i] = f"cuda:{gpu}"
    return out


def checked(count: int, options: LoadOptions) -> tuple[list[str], list[str]]:
    """A device and a dtype for each of `count` models; ModelLoadError on a bad, missing or miscounted one."""
    devices = per_model(options.device, count, "device")
    dtypes = per_model(options.dtype, count, "dtype")
    for device, dtype in zip(devices, dtypes):
        pick_dtype(pick_device(device), dtype)
    return devices, dtypes


def placed(
    specs: Sequence[str], options: LoadOptions, count: Callable[[str, LoadOptions], int] = parameter_count
) -> list[LoadOptions]:
    """Each spec's own options (one device, one dtype), checked; `count`: a model's parameters."""
    import torch

    devices, dtypes = checked(len(specs), options)
    # A model in a Ray actor is placed by Ray (its spec's gpus=), not spread here.
    auto = [i for i, device in enumerate(devices) if device == "auto" and scheme_of(specs[i]) is None]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(auto) > 1 and gpus > 1:
        for i, device in zip(auto, spread([count(specs[i], options) for i in auto], gpus)):
            devices[i] = device
    return [replace(options, device=device, dtype=dtype) for device, dtype in zip(devices, dtypes)]
