from __future__ import annotations

import itertools

import pytest
import torch

from polykernels.quant import fake_int4_quant, fake_int4_quant_reference, int4_quant_codes
from tests.helpers import bits

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_bit_equal(got: tuple, want: tuple) -> None:
    for label, a, b in zip(("out", "scale", "zero"), got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, label
        assert torch.equal(bits(a), bits(b)), f"{label} differs in {(bits(a) != bits(b)).sum().item()} elements"


@pytest.mark.parametrize(("dtype", "group_size", "symmetric"),
                         list(itertools.product(DTYPES, [32, 64, 128, 256], [True, False])),
                         ids=lambda v: str(v).removeprefix("torch."))
def test_cpu_kernel_bit_equal_to_reference(dtype: torch.dtype, group_size: int, symmetric: bool) -> None:
    x = (torch.randn(3, 5, 512, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    assert_bit_equal(fake_int4_quant(x, group_size, symmetric), fake_int4_quant_reference(x, group_size, symmetric))
    assert_bit_equal(int4_quant_codes(x, group_size, symmetric),
                     fake_int4_quant_reference(x, group_size, symmetric, return_codes=True))


def near_ties(groups: int, group_size: int, device: str = "cpu") -> torch.Tensor:
    """fp32 groups whose values sit on and a few ulps around half-integer multiples of the group's
    scale: where x * (1 / scale) and x / scale can round to different integers (the kernels'
    rounded_quotient must fall back to the division there, and only there)."""
    gen = torch.Generator().manual_seed(3)
    top = torch.rand(groups, 1, generator=gen) * 100 + 1e-3  # max |x| of each group
    scale = top * (1 / 7)
    steps = torch.randint(-7, 7, (groups, group_size), generator=gen) + 0.5
    x = steps * scale
    ulps = torch.randint(-4, 5, (groups, group_size), generator=gen, dtype=torch.int32)
    x = (x.view(torch.int32) + ulps).view(torch.float32)  # a few ulps off the tie, or on it
    x[:, 0] = top[:, 0]  # the group's extreme, so the scale is the one above
    return x.to(device)


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_rounding_at_and_near_ties_is_the_division(symmetric: bool) -> None:
    x = near_ties(4096, 32)
    assert_bit_equal(fake_int4_quant(x, 32, symmetric), fake_int4_quant_reference(x, 32, symmetric))
    assert_bit_equal(int4_quant_codes(x, 32, symmetric),
                     fake_int4_quant_reference(x, 32, symmetric, return_codes=True))


def test_codes_in_range_and_dequantize_to_out() -> None:
    x = torch.randn(4, 256)
    for symmetric, (low, high) in ((True, (-7, 7)), (False, (0, 15))):
        codes, scale, zero = int4_quant_codes(x, 64, symmetric)
        assert codes.dtype == torch.int8 and int(codes.min()) >= low and int(codes.max()) <= high
        out, _, _ = fake_int4_quant(x, 64, symmetric)
        rebuilt = (codes.float().view(4, 4, 64) - zero.float()[..., None]) * scale[..., None]
        assert torch.equal(rebuilt.view(4, 256), out)


def test_symmetric_zero_is_zero_not_garbage() -> None:
    _, _, zero = fake_int4_quant(torch.randn(64, 128), 32, True)
    assert torch.count_nonzero(zero) == 0


def test_asymmetric_zero_point_clamped_to_code_range() -> None:
    x = torch.full((1, 32), 5.0)
    x[0, 0] = 5.5  # all positive: -min/scale would be far below 0 without the clamp
    _, _, zero = fake_int4_quant(x, 32, False)
    assert 0 <= int(zero) <= 15


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("symmetric", [True, False])
def test_non_finite_group_is_all_nan_and_others_untouched(bad: float, symmetric: bool) -> None:
    x = torch.randn(2, 64)
    x[0, 3] = bad
    out, scale, zero = fake_int4_quant(x, 32, symmetric)
    assert torch.isnan(out[0, :32]).all() and torch.isnan(scale[0, 0]) and int(zero[0, 0]) == 0
    assert torch.isfinite(out[0, 32:]).all() and torch.isfinite(out[1]).all()


def test_zero_element_input_returns_empty_outputs() -> None:
    out, scale, zero = fake_int4_quant(torch.empty(0, 128), 128)
    assert out.shape == (0, 128) and scale.shape == (0, 1) and zero.shape == (0, 1)


def test_straight_through_gradient() -> None:
    x = torch.randn(4, 64, requires_grad=True)
    out, _, _ = fake_int4_quant(x, 32)
    (out * torch.arange(64.0)).sum().backward()
    assert torch.equal(x.grad, torch.arange(64.0).expand(4, 64))


def test_torch_compile_traces_the_op() -> None:
    x = torch.randn(8, 128)
    compiled = torch.compile(lambda t: fake_int4_quant(t, 64)[0] * 2, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), fake_int4_quant(x, 64)[0] * 2)


def test_fake_tensor_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out, scale, zero = fake_int4_quant(torch.empty(2, 3, 256, dtype=torch.bfloat16), 128)
    assert out.shape == (2, 3, 256) and out.dtype == torch.bfloat16
    assert scale.shape == (2, 3, 2) and scale.dtype == torch.float32 and zero.dtype == torch.int8


@pytest.mark.parametrize(
    ("x", "group_size", "error", "match"),
    [
        (torch.randn(2, 100), 32, ValueError, r"last dimension \(100\) must be divisible by group_size \(32\)"),
        (torch.randn(2, 96), 48, ValueError, r"group_size must be one of \(32, 64, 128, 256\), got 48"),
        (torch.randn(2, 1024), 512, ValueError, r"group_size must be one of"),
        (torch.randn(2, 64), 32.0, TypeError, r"group_size must be an int"),
        (torch.randn(2, 64).double(), 32, TypeError, r"x must be float32, float16 or bfloat16, got torch.float64"),
        (torch.randint(0, 5, (2, 64)), 32, TypeError, r"x must be float32"),
        (torch.randn(64, 2).t(), 32, ValueError, r"x must be contiguous"),
        (torch.tensor(1.0), 32, ValueError, r"at least one dimension"),
        ([1.0] * 32, 32, TypeError, r"x must be a torch.Tensor"),
        (torch.randn(2, 64, device="meta").to("meta"), 32, None, None),
    ],
    ids=["not-divisible", "not-power-of-two", "too-large", "float-group", "float64", "int", "non-contiguous",
         "scalar", "list", "meta-ok"],
)
def test_bad_input_names_the_argument(x: object, group_size: object, error: type | None, match: str | None) -> None:
    if error is None:
        out, scale, zero = fake_int4_quant(x, group_size)  # meta tensors go through the fake kernel
        assert out.device.type == "meta" and out.shape == x.shape and out.dtype == x.dtype
        assert scale.shape == zero.shape == (2, 2) and scale.dtype == torch.float32 and zero.dtype == torch.int8
        return
    with pytest.raises(error, match=match):
        fake_int4_quant(x, group_size)


@pytest.mark.parametrize("symmetric", [None, "False", "True", 0, 1, 1.0], ids=repr)
@pytest.mark.parametrize("op", [fake_int4_quant, int4_quant_codes], ids=lambda f: f.__name__)
def test_symmetric_must_be_a_real_bool(op: object, symmetric: object) -> None:
    # bool(None) is False and bool('False') is True: a coercion would quantize the other way, silently.
    with pytest.raises(TypeError, match=r"symmetric must be a bool .*got " + type(symmetric).__name__):
        op(torch.randn(2, 64), 32, symmetric)


def test_direct_op_call_is_checked_in_cpp_too() -> None:
    fake_int4_quant(torch.randn(1, 32), 32)  # loads and registers the library
    with pytest.raises(RuntimeError, match=r"group_size must be one of 32, 64, 128, 256, got 48"):
        torch.ops.polykernels.fake_int4_quant(torch.randn(2, 96), 48, True)


@pytest.mark.gpu
def test_gpu_kernel_bit_equal_to_reference_on_device(gpu_device: str) -> None:
    for dtype, group_size, symmetric in itertools.product(DTYPES, [32, 64, 128, 256], [True, False]):
        x = (torch.randn(33, 1024, device=gpu_device) * 3).to(dtype)
        assert_bit_equal(fake_int4_quant(x, group_size, symmetric),
                         fake_int4_quant_reference(x, group_size, symmetric))
        cpu = fake_int4_quant(x.cpu(), group_size, symmetric)
        gpu = fake_int4_quant(x, group_size, symmetric)
        assert_bit_equal(tuple(t.cpu() for t in gpu), cpu)  # identical across backends


@pytest.mark.gpu
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_gpu_rounding_at_and_near_ties_is_the_division(gpu_device: str, symmetric: bool) -> None:
    x = near_ties(4096, 32, gpu_device)
    assert_bit_equal(fake_int4_quant(x, 32, symmetric), fake_int4_quant_reference(x, 32, symmetric))
    assert_bit_equal(int4_quant_codes(x, 32, symmetric),
                     fake_int4_quant_reference(x, 32, symmetric, return_codes=True))


@pytest.mark.gpu
def test_gpu_unaligned_input_uses_scalar_path(gpu_device: str) -> None:
    base = torch.randn(4 * 128 + 1, device=gpu_device, dtype=torch.bfloat16)
    x = base[1:].view(4, 128)  # storage offset 2 bytes: the vector path would misalign
    assert_bit_equal(fake_int4_quant(x, 128), fake_int4_quant_reference(x, 128))


@pytest.mark.gpu
def test_gpu_direct_call_matches_the_dispatcher_and_keeps_the_gradient(gpu_device: str) -> None:
    # Eager GPU calls that need no gradient skip the autograd wrapper (host time); the results
    # must be those of the full dispatch, and a tensor that needs a gradient must still get one.
    x = (torch.randn(16, 512, device=gpu_device) * 3).to(torch.bfloat16)
    for symmetric in (True, False):
        assert_bit_equal(fake_int4_quant(x, 128, symmetric), torch.ops.polykernels.fake_int4_quant(x, 128, symmetric))
        assert_bit_equal(int4_quant_codes(x, 128, symmetric), torch.ops.polykernels.int4_quant_codes(x, 128, symmetric))
    leaf = x.float().requires_grad_()
    out, _, _ = fake_int4_quant(leaf, 128)
    out.sum().backward()
    assert leaf.grad is not None and torch.equal(leaf.grad, torch.ones_like(leaf))
