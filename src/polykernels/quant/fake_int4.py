"""Public INT4 fake-quantization ops over the compiled kernels (csrc/int4_qat).

The C++ library defines ``polykernels::fake_int4_quant`` and ``polykernels::int4_quant_codes``;
this module adds what the stable ABI leaves to Python: fake (meta) kernels so torch.compile
can trace the op, the straight-through gradient for QAT, and argument checks whose messages
name the argument.
"""

from __future__ import annotations

import functools

import torch

from polykernels import _extension
from polykernels.quant.guards import GROUP_SIZES, choose_path

_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_registered = False


def _outputs_like(x: torch.Tensor, group_size: int, codes: bool) -> tuple[torch.Tensor, ...]:
    group_shape = (*x.shape[:-1], x.shape[-1] // group_size)
    out = x.new_empty(x.shape, dtype=torch.int8) if codes else torch.empty_like(x)
    return out, x.new_empty(group_shape, dtype=torch.float32), x.new_empty(group_shape, dtype=torch.int8)


def _straight_through(ctx: object, grad_out: torch.Tensor, grad_scale: object, grad_zero: object) -> tuple:
    return grad_out, None, None


def _register_python_side() -> None:
    global _registered
    if _registered:
        return
    _extension.require()
    torch.library.register_fake("polykernels::fake_int4_quant")(
        lambda x, group_size, symmetric: _outputs_like(x, group_size, codes=False)
    )
    torch.library.register_fake("polykernels::int4_quant_codes")(
        lambda x, group_size, symmetric: _outputs_like(x, group_size, codes=True)
    )
    torch.library.register_autograd("polykernels::fake_int4_quant", _straight_through)
    _registered = True


def check_arguments(x: object, group_size: object, symmetric: object = True) -> None:
    """Raise TypeError/ValueError naming the argument; shared by both public ops.

    ``symmetric`` must be a real ``bool``: ``None`` or the string ``'False'`` would otherwise
    be coerced by ``bool()`` into the opposite of what the caller meant, silently."""
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool (True or False), got {type(symmetric).__name__} {symmetric!r}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension, got a 0-d tensor")
    if x.shape[-1] % group_size:
        raise ValueError(
            f"x's last dimension ({x.shape[-1]}) must be divisible by group_size ({group_size}); "
            f"x has shape {tuple(x.shape)}"
        )
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous (got strides {x.stride()} for shape {tuple(x.shape)}); "
                         "call x.contiguous() first")
    # Kernel availability is a property of the process, checked in eager mode only (dynamo
    # cannot trace the library lookup, and a traced call was checked when it ran eagerly).
    if x.device.type != "meta" and not torch.compiler.is_compiling():
        choice = _kernel_choice(x.device.type)
        if not choice.ok:
            raise RuntimeError(f"fake_int4_quant: no kernel for x on {x.device}: {choice.reason}")


# The kernel per device type, looked up once: the extension's kernels do not change in a process.
_kernel_choice = functools.cache(choose_path)


# The backend kernel's key: CUDA and ROCm tensors both dispatch as CUDA.
_GPU_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


def _call(op: torch._ops.OpOverloadPacket, x: torch.Tensor, group_size: int, symmetric: bool) -> tuple:
    """The op, straight to its GPU kernel when nothing above it has work to do.

    Through the dispatcher an eager call first enters the Python autograd wrapper (the
    straight-through gradient), about as much host time as the kernel of a small tensor takes.
    A plain GPU tensor that needs no gradient, outside torch.compile and any dispatch mode,
    goes to the kernel directly; everything else takes the full path.
    """
    if (type(x) is torch.Tensor and x.is_cuda and not (x.requires_grad and torch.is_grad_enabled())
            and not torch._C._len_torch_dispatch_stack() and not torch.compiler.is_compiling()):
        return op.default.redispatch(_GPU_KERNEL, x, group_size, symmetric)
    return op(x, group_size, symmetric)


def fake_int4_quant(
    x: torch.Tensor, group_size: int = 128, symmetric: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise INT4 fake quantization along the last dim.

    Args:
        x: ``[..., N]`` float32/float16/bfloat16, contiguous, on CPU or a CUDA/ROCm GPU;
            ``N % group_size == 0``.
        group_size: 32, 64, 128 or 256 consecutive elements share a scale (and zero point).
        symmetric: codes in [-7, 7] (zero is 0), else asymmetric codes in [0, 15].

    Returns:
        ``(out, scale, zero)``: ``out`` ``[..., N]`` in x's dtype (quantized then dequantized),
        ``scale`` ``[..., N // group_size]`` float32, ``zero`` the same shape, int8.
        A group holding NaN or +-Inf gets scale NaN, zero 0 and all-NaN output, on every backend.
        Zero-element inputs return zero-element outputs.

    Differentiable: the gradient is straight-through (d out / d x = identity), as QAT expects.
    """
    check_arguments(x, group_size, symmetric)
    _register_python_side()
    return _call(torch.ops.polykernels.fake_int4_quant, x, group_size, symmetric)


def int4_quant_codes(
    x: torch.Tensor, group_size: int = 128, symmetric: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like :func:`fake_int4_quant` but returns the int8 codes instead of dequantized values (exporters)."""
    check_arguments(x, group_size, symmetric)
    _register_python_side()
    return _call(torch.ops.polykernels.int4_quant_codes, x, group_size, symmetric)
