"""The extension's direct launch (polykernels._C, csrc/launch/python_module.cpp): what the launchers of
polykernels._launch call for a plain launch once Triton has compiled the kernel.

Its argument checks run on any build; launching needs the CUDA extension and a GPU (``gpu``): there
a kernel launched through it is compared with the same kernel through Triton's own launcher, in a
CUDA graph, and from a thread that never touched the GPU."""

from __future__ import annotations

import functools
import threading

import pytest
import torch
import triton
import triton.language as tl

from polykernels import _extension, _launch, _manifest
from polykernels._launch import Launcher, constexpr_values, parameter_kinds


@pytest.fixture
def native() -> object:
    _extension.require()
    from polykernels import _C

    return _C


@pytest.mark.parametrize(("types", "num_args", "kinds"), [
    (("*bf16", "*fp32", "i32", "i64", "u64", "i1", "fp32", "fp64", "constexpr"), 8, b"ppiiiifd"),
    (("*fp32", "constexpr", "i32", "constexpr", "constexpr"), 3, b"pxi"),  # an integer specialized to 1
    (("*fp32", "i32"), 2, b"pi"),
])
def test_parameter_kinds_follow_tritons_types(types: tuple[str, ...], num_args: int, kinds: bytes) -> None:
    assert parameter_kinds(types, num_args) == kinds


@pytest.mark.parametrize(("types", "num_args"), [
    (("*fp32", "fp16"), 2),  # a 16-bit float scalar
    (("*fp32", "tensordesc<bf16[64, 64]>"), 2),
    (("*fp32", "i32", "i32"), 2),  # a parameter after the runtime ones that is not a constexpr
    (("*fp32",), 2),  # fewer parameters than arguments
])
def test_parameter_kinds_refuse_what_the_launch_cannot_read(types: tuple[str, ...], num_args: int) -> None:
    assert parameter_kinds(types, num_args) is None


def test_the_native_launch_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYKERNELS_NATIVE_LAUNCH", "0")
    _launch.native_launch.cache_clear()
    try:
        assert _launch.native_launch() is None
    finally:
        _launch.native_launch.cache_clear()


@pytest.mark.parametrize(("args", "match"), [
    ((0, 128, 0, b"p"), "function must be"),
    ((1, 0, 0, b"p"), "threads must be"),
    ((1, 2048, 0, b"p"), "threads must be"),
    ((1, 128, -1, b"p"), "shared_bytes must be"),
    ((1, 128, 0, "p"), "kinds must be bytes"),
    ((1, 128, 0, b"pz"), "kinds\\[1\\] is byte 122"),
    ((1, 128, 0, b"i" * 65), "at most 64 parameters"),
    ((1, 128, 0), "takes \\(function, threads, shared_bytes, kinds\\)"),
])
def test_a_kernel_description_is_checked_by_name(native: object, args: tuple, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        native.kernel(*args)


@pytest.mark.parametrize(("args", "match"), [
    (("not a kernel", 1, 1, 1, 0, (1,)), "kernel must be what kernel\\(\\) returned"),
    ((None, 0, 1, 1, 0, (1,)), "grid dimension 0"),
    ((None, 1, 1, 2**31, 0, (1,)), "grid dimension 2"),
    ((None, 1, 1, 1, 0, {1}), "args must be a tuple or a list"),
    ((None, 1, 1, 1, 0, (1, 2)), "takes 1 runtime arguments, got 2"),
    ((None, 1, 1, 1, 0), "takes \\(kernel, grid_x, grid_y, grid_z, stream, args\\)"),
])
def test_a_launch_is_checked_by_name_before_anything_runs(native: object, args: tuple, match: str) -> None:
    kernel = native.kernel(0xABC, 128, 0, b"p")
    args = tuple(kernel if arg is None and i == 0 else arg for i, arg in enumerate(args))
    with pytest.raises((TypeError, ValueError), match=match):
        native.launch(*args)


def test_only_a_gpu_build_launches(native: object) -> None:
    info = _manifest.load_build_info()
    gpu_build = info is not None and info.backend != "cpu"
    assert native.has_gpu_launch() == gpu_build
    if not gpu_build:
        with pytest.raises(RuntimeError, match="no GPU backend"):
            native.launch(native.kernel(0xABC, 128, 0, b"p"), 1, 1, 1, 0, (0,))


_BIG = 2**33


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, offset, alpha, ONE, BLOCK: tl.constexpr, BIG: tl.constexpr):
    """out = alpha * x + y + (offset - BIG) * ONE: offset is an int64 past BIG, ONE is 1 (Triton
    specializes it into the code: no parameter)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask)
    y = tl.load(y_ptr + i, mask=mask)
    tl.store(out_ptr + i, alpha * x + y + ((offset - BIG) * ONE).to(tl.float32), mask=mask)


def _axpy(launcher: Launcher, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, alpha: float) -> None:
    n = x.numel()
    launcher((triton.cdiv(n, 256),), (x, y, out, n, _BIG + 3, alpha, 1),
             {"BLOCK": 256, "BIG": _BIG, "num_warps": 4}, spec_key=("axpy", n))


@triton.jit
def _shift_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 2.0, TWICE: tl.constexpr = False):
    """out = x + SHIFT (twice with TWICE): constexprs a launch may leave at their defaults."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask)
    tl.store(out_ptr + i, x + SHIFT * (2.0 if TWICE else 1.0), mask=mask)


def test_constexprs_left_out_take_their_defaults() -> None:
    # Triton's interpreter (the CPU tests) wraps the function without its signature: the compiler's view of it.
    kernel = _shift_kernel if hasattr(_shift_kernel, "constexprs") else triton.runtime.jit.JITFunction(_shift_kernel.fn)
    assert constexpr_values(kernel, 3, {"BLOCK": 64}) == (64, 2.0, False)
    assert constexpr_values(kernel, 3, {"BLOCK": 64, "TWICE": True, "num_warps": 4}) == (64, 2.0, True)
    with pytest.raises(TypeError, match="'BLOCK' was not given and has no default"):
        constexpr_values(kernel, 3, {"SHIFT": 1.0})


@pytest.mark.gpu
def test_gpu_a_native_launch_passes_the_defaults_its_warm_up_compiled(gpu_device: str) -> None:
    x = torch.randn(1000, device="cuda")
    launcher = Launcher(_shift_kernel)
    outputs = []
    for twice in (False, True):
        for _ in range(2):  # Triton's launch compiles, then the direct launch
            out = torch.empty_like(x)
            meta = {"BLOCK": 256, "num_warps": 4, **({"TWICE": True} if twice else {})}
            launcher((4,), (x, out, 1000), meta, spec_key=("shift", twice))
            outputs.append(out)
        assert launcher.cached(("shift", twice)) is not None  # the second call took the direct launch
    for out, shift in zip(outputs, (2.0, 2.0, 4.0, 4.0), strict=True):
        torch.testing.assert_close(out, x + shift, rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_a_native_launch_gives_tritons_result(gpu_device: str) -> None:
    _launch.native_launch.cache_clear()
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    launcher = Launcher(_axpy_kernel)
    first, second = torch.empty_like(x), torch.empty_like(x)
    _axpy(launcher, x, y, first, 0.5)  # Triton's launch compiles the kernel
    direct = launcher.cached(("axpy", 1000))
    assert isinstance(direct, functools.partial) and direct.func is _launch.native_launch().launch
    _axpy(launcher, x, y, second, 0.5)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(second, 0.5 * x + y + 3.0)


@pytest.mark.gpu
def test_gpu_a_native_launch_is_captured_in_a_cuda_graph(gpu_device: str) -> None:
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    launcher = Launcher(_axpy_kernel)
    _axpy(launcher, x, y, out, 2.0)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _axpy(launcher, x, y, out, 3.0)
    out.zero_()
    x.copy_(torch.ones_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 3.0 + y + 3.0)


@pytest.mark.gpu
def test_gpu_a_native_launch_from_a_fresh_thread_binds_the_device(gpu_device: str) -> None:
    x, y = torch.randn(512, device="cuda"), torch.randn(512, device="cuda")
    out = torch.empty_like(x)
    launcher = Launcher(_axpy_kernel)
    _axpy(launcher, x, y, out, 1.0)
    out.zero_()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            _axpy(launcher, x, y, out, 1.0)
            torch.cuda.synchronize()
        except BaseException as error:  # reported by the test's thread
            errors.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors
    torch.testing.assert_close(out, x + y + 3.0)


@pytest.mark.gpu
def test_gpu_a_launch_the_driver_refuses_raises_its_error(gpu_device: str) -> None:
    x = torch.randn(256, device="cuda")
    launcher = Launcher(_axpy_kernel)
    _axpy(launcher, x, x, torch.empty_like(x), 1.0)
    direct = launcher.cached(("axpy", 256))
    stream = torch.cuda.current_stream().cuda_stream
    with pytest.raises(RuntimeError, match="driver refused the kernel launch"):
        direct(1, 70000, 1, stream, (x, x, x.data_ptr(), 256, _BIG, 1.0, 1))  # an address for out  # grid y past 65535
