"""Host side shared by the kernel families: sm_90a compilation with a cache keyed by shape and dtype, fake
tensors for GPU-less compile checks, torch -> CuTe tensor and stream conversion, argument validation."""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import Any

import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack, make_fake_compact_tensor, make_fake_stream

# Without this and without a GPU the DSL targets sm_100a; the kernels are written for (and validated on) Hopper.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

ALIGN = 16  # every kernel issues 16-byte vector loads

COPY_BANDWIDTH = 4.3e12  # B/s: the H200's measured device-to-device copy rate, the rate of every byte floor


def floor_us(nbytes: int) -> float:
    """The time to move nbytes at COPY_BANDWIDTH, in microseconds."""
    return nbytes / COPY_BANDWIDTH * 1e6


_CACHE: dict[Hashable, Callable[..., Any]] = {}


def compile_cached(key: Hashable, build: Callable[[], tuple[Any, tuple[Any, ...]]]) -> Callable[..., Any]:
    """The compiled kernel for `key`; `build()` returns (jit object, fake arguments) on the first request only.
    (No register cap here: ptxas ignores -maxrregcount next to the .reqntid bound the DSL emits for a static block
    size; a kernel that needs a cap bounds its CTAs per SM at launch, as the finalize does.)"""
    fn = _CACHE.get(key)
    if fn is None:
        op, args = build()
        fn = cute.compile(op, *args)
        _CACHE[key] = fn
    return fn


def cache_size() -> int:
    return len(_CACHE)


def fake(dtype: type, shape: tuple[Any, ...]) -> Any:
    """A row-major fake tensor (dims may be cute.sym_int32()) for compiling without a GPU."""
    return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)), assumed_align=ALIGN)


def fake_stream() -> Any:
    return make_fake_stream()


def dyn() -> Any:
    """A dynamic (run-time) dimension, e.g. the decode batch M."""
    return cute.sym_int32()


def to_cute(t: Any, dynamic_rows: bool = False) -> Any:
    """A CuTe view of torch tensor `t`; dynamic_rows must match the fake tensor it was compiled with (a dyn()
    leading dimension), so the runtime descriptor has the layout the compiled code expects."""
    view = from_dlpack(t, assumed_align=ALIGN)
    return view.mark_compact_shape_dynamic(mode=0) if dynamic_rows else view


def cu_stream(stream: Any) -> Any:
    import cuda.bindings.driver as cuda

    return cuda.CUstream(stream.cuda_stream)


def expect(name: str, t: Any, shape: tuple[int, ...], dtype: str, device: bool = True) -> None:
    """Raise ValueError naming the argument unless `t` is a contiguous, 16-byte aligned CUDA tensor of `shape` and
    `dtype` (device=False: the shape, dtype and contiguity only)."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if str(t.dtype) != f"torch.{dtype}":
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    if not device:
        return
    if not t.is_cuda:
        raise ValueError(f"{name}: must be a CUDA tensor (the kernels run on the GPU), got device {t.device}")
    if t.data_ptr() % ALIGN:
        raise ValueError(f"{name}: data pointer must be {ALIGN}-byte aligned")


def expect_all(specs: list[tuple[Any, ...]]) -> None:
    """expect() for every (name, tensor, shape, dtype), every shape and dtype before any device, so that a wrong shape
    is reported as one wherever the tensors are (and the host checks can be tested without a GPU)."""
    for spec in specs:
        expect(*spec, device=False)
    for spec in specs:
        expect(*spec)
