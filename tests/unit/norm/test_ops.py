from __future__ import annotations

import pytest
import torch

from polykernels import platform
from polykernels.norm import (
    choose,
    head_rmsnorm,
    layernorm_modulate,
    layernorm_modulate_reference,
    prefer,
    qk_rmsnorm,
    qk_rmsnorm_reference,
    rmsnorm_scale_shift,
    rmsnorm_scale_shift_reference,
)
from polykernels.norm.ops import _launch_norm, launch_qk_rmsnorm
from tests.helpers import relative_rms_error

H100 = platform.Platform(backend="cuda", arch="sm_90", device_name="H100", warp_size=32, runtime_version="13.0")
MI300X = platform.Platform(backend="rocm", arch="gfx942", device_name="MI300X", warp_size=64, runtime_version="7.0")
MI355X = platform.Platform(backend="rocm", arch="gfx950", device_name="MI355X", warp_size=64, runtime_version="7.0")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def modulation(batch: int, tokens: int, dim: int, form: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if form == "chunked":  # [B, D] views of one projection, as AdaLayerNormZero makes them
        emb = torch.randn(batch, 6 * dim, dtype=dtype)
        shift, scale = emb.chunk(6, dim=1)[:2]
        return shift, scale
    if form == "per_sample":
        return torch.randn(batch, 1, dim, dtype=dtype), torch.randn(batch, 1, dim, dtype=dtype)
    return torch.randn(batch, tokens, dim, dtype=dtype), torch.randn(batch, tokens, dim, dtype=dtype)


def modulated_reference(x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor,
                        scale: torch.Tensor) -> torch.Tensor:
    """LayerNorm+modulate without a weight, RMSNorm+scale/shift with one."""
    if weight is None:
        return layernorm_modulate_reference(x, shift, scale)
    return rmsnorm_scale_shift_reference(x, weight, shift, scale)


@pytest.mark.cpu_only
@pytest.mark.parametrize("dim", [1, 64, 100, 3072])
@pytest.mark.parametrize("form", ["chunked", "per_sample", "per_token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_portable_kernel_matches_reference(dim: int, form: str, dtype: torch.dtype, rms: bool) -> None:
    x = torch.randn(2, 3, dim).to(dtype)
    shift, scale = modulation(2, 3, dim, form, dtype)
    weight = torch.randn(dim).to(dtype) if rms else None
    y, _, _ = _launch_norm(x, weight, shift, scale, 1e-6, exact=False)
    want = modulated_reference(x, weight, shift, scale)
    assert y.dtype == dtype
    assert relative_rms_error(y, want) < TOLERANCE[dtype]


@pytest.mark.cpu_only
@pytest.mark.parametrize("form", ["chunked", "per_token"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_persistent_grid_steps_through_every_block(form: str, rms: bool) -> None:
    from polykernels.norm.kernels import PERSISTENT_MIN_ROWS_PER_SM, modulated_launch_config

    # The interpreter counts one SM: 41 rows x 2 samples take the persistent grid, whose programs
    # step through many 2-row blocks, the last one half full.
    batch, tokens, dim = 2, 41, 3072
    assert modulated_launch_config(4096, batch * tokens, 1)[2] > 0 and batch * tokens >= PERSISTENT_MIN_ROWS_PER_SM
    x = torch.randn(batch, tokens, dim, dtype=torch.bfloat16)
    shift, scale = modulation(batch, tokens, dim, form, torch.bfloat16)
    weight = torch.randn(dim).to(torch.bfloat16) if rms else None
    y, _, _ = _launch_norm(x, weight, shift, scale, 1e-6, exact=False)
    want = modulated_reference(x, weight, shift, scale)
    assert relative_rms_error(y, want) < TOLERANCE[torch.bfloat16]


@pytest.mark.cpu_only
@pytest.mark.parametrize("head_dim", [16, 128, 72])
def test_qk_rmsnorm_kernel_matches_reference(head_dim: int) -> None:
    q, k = torch.randn(2, 9, 3, head_dim).half(), torch.randn(2, 5, 3, head_dim).half()
    wq, wk = torch.randn(head_dim).half(), torch.randn(head_dim).half()
    got, want = launch_qk_rmsnorm(q, k, wq, wk, 1e-6), qk_rmsnorm_reference(q, k, wq, wk)
    assert relative_rms_error(got[0], want[0]) < 2e-3 and relative_rms_error(got[1], want[1]) < 2e-3


def test_public_ops_on_cpu_run_the_reference() -> None:
    x = torch.randn(2, 4, 32)
    shift, scale = torch.randn(2, 32), torch.randn(2, 32)
    assert torch.equal(layernorm_modulate(x, shift, scale), layernorm_modulate_reference(x, shift, scale))
    w = torch.randn(32)
    assert torch.equal(rmsnorm_scale_shift(x, w, shift, scale), rmsnorm_scale_shift_reference(x, w, shift, scale))
    q = torch.randn(1, 4, 2, 32)
    assert torch.equal(qk_rmsnorm(q, q, w, w)[0], qk_rmsnorm_reference(q, q, w, w)[0])


# The guard, faked per platform: the PTX path is chosen only on CUDA, and never on ROCm.
@pytest.mark.parametrize(
    ("seen", "dtype", "contiguous", "expected"),
    [
        (H100, torch.bfloat16, True, "ptx"),
        (H100, torch.float32, True, "ptx"),
        (H100, torch.bfloat16, False, "triton"),
        (H100, torch.float64, True, "triton"),
        (MI300X, torch.bfloat16, True, "triton"),
        (MI300X, torch.float32, True, "triton"),
        (MI355X, torch.bfloat16, True, "triton"),
        (MI355X, torch.float16, False, "triton"),
    ],
    ids=lambda v: getattr(v, "arch", str(v)),
)
def test_guard_choice_per_platform(seen: platform.Platform, dtype: torch.dtype, contiguous: bool,
                                   expected: str) -> None:
    with platform.use(seen):
        choice = choose("cuda", dtype, contiguous)
        assert choice.path == expected, choice.reason
        if seen.backend == "rocm":
            assert "inline PTX cannot compile" in choice.reason
        assert choose("cpu", dtype, contiguous).path == "torch"
        assert choose("cuda", dtype, contiguous, exact_epilogue=False).path == "triton"
        with prefer("portable"):
            assert choose("cuda", dtype, contiguous).path == "triton"


@pytest.mark.parametrize(("seen", "expected_flags"), [(MI300X, [False]), (MI355X, [False]), (H100, [True])],
                         ids=["gfx942", "gfx950", "sm_90"])
def test_op_asks_for_ptx_only_where_guard_allows(monkeypatch, seen, expected_flags) -> None:
    # Record the EXACT_PTX flag of every launch instead of launching, with the tensor treated
    # as a GPU tensor of the faked platform.
    from polykernels.norm import ops

    flags = []
    plan = ops._norm_plan
    monkeypatch.setattr(ops, "_norm_plan", lambda *a, exact: flags.append(exact) or plan(*a, exact=exact))
    monkeypatch.setattr(ops, "_run_norm", lambda plan, x, *a: x.clone())
    monkeypatch.setattr(ops, "_eager_gpu", lambda x: True)
    monkeypatch.setattr(ops, "_eager_plans", {})
    real_choose = ops.guards.choose
    monkeypatch.setattr(ops.guards, "choose", lambda device_type, *a, **k: real_choose("cuda", *a, **k))
    with platform.use(seen):
        layernorm_modulate(torch.randn(1, 2, 8), torch.zeros(1, 1, 8), torch.zeros(1, 1, 8))
    assert flags == expected_flags


def test_forget_plans_drops_the_kept_launches() -> None:
    """The launchers keep one compiled kernel per class of call whatever the launch tables say: a
    sweep that edits a table and forgets the plans must get new launchers, or every column after
    the first runs the first column's kernel on the new grid."""
    from polykernels.norm import ops

    before = ops._launchers()
    ops.forget_plans()
    assert ops._launchers() is not before


@pytest.mark.parametrize(("seen", "capped"), [(H100, True), (MI300X, False), (MI355X, False)],
                         ids=["sm_90", "gfx942", "gfx950"])
def test_register_cap_reaches_the_eager_launch_on_cuda_only(seen: platform.Platform, capped: bool) -> None:
    """FLUX's B1 L1024 norm launches 8-warp programs: on CUDA they carry the register cap of
    NORM_MAX_REGISTERS_CUDA (two programs per SM); ROCm launches have no such option."""
    from polykernels.norm import ops
    from polykernels.norm.kernels import NORM_MAX_REGISTERS_CUDA

    x = torch.randn(1, 1024, 3072)
    shift, scale = torch.randn(1, 6 * 3072).chunk(6, dim=1)[:2]
    strides = (*ops._check_modulation(shift, "shift", x), *ops._check_modulation(scale, "scale", x))
    with platform.use(seen):
        ops.forget_plans()
        _, meta = ops._norm_meta(x, torch.randn(3072), strides, exact=False, stats=False)
    ops.forget_plans()
    assert meta["num_warps"] == 8
    assert meta.get("maxnreg") == (NORM_MAX_REGISTERS_CUDA[8] if capped else None)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["layernorm_modulate_ptx", "rmsnorm_scale_shift_ptx"])
def test_ptx_specialization_kills_the_compiler_for_gfx942(kernel: str) -> None:
    # The real failure, no AMD hardware needed: LLVM's fatal error ends the compiling process
    # (no exception), which is why the guard must decide before the first launch.
    from polykernels.kernel_registry import probe

    result = probe(kernel, "hip:gfx942")
    assert not result.compiled and "couldn't allocate output register for constraint 'f'" in result.detail
    assert not result.allowed and result.consistent  # the guard keeps it off ROCm


def test_the_compile_matrix_specializes_the_integers_the_launcher_sees_as_multiples_of_16() -> None:
    """The registry's multiple_of_16 names hold at FLUX's shapes: the compile matrix reads the
    kernel the launcher runs there (16-byte loads), not a scalar-load variant of it."""
    from polykernels.kernel_registry import kernels
    from polykernels.norm import ops

    x = torch.randn(2, 4608, 3072)
    shift, scale = torch.randn(2, 6 * 3072).chunk(6, dim=1)[:2]  # AdaLayerNormZero's chunks
    norm_ints = ops._norm_plan(x, None, shift, scale, (*ops._check_modulation(shift, "shift", x),
                                                      *ops._check_modulation(scale, "scale", x)), exact=False).ints
    heads = torch.randn(1, 4608, 24, 128)
    qk_ints = ops._qk_plan(heads, heads, torch.randn(128), torch.randn(128), only_q=False).ints
    seen = {"norm_modulate_kernel": norm_ints, "qk_rmsnorm_kernel": qk_ints}
    for spec in kernels().values():
        if spec.function not in seen:
            continue
        int_names = [name for name, kind in spec.signature.items() if kind in ("i32", "i64")]
        values = dict(zip(int_names, seen[spec.function], strict=True))
        assert spec.multiple_of_16, spec.name
        assert all(values[name] % 16 == 0 for name in spec.multiple_of_16), (spec.name, values)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["hip:gfx942", "hip:gfx950", "cuda:90"])
def test_portable_kernels_compile_for_amd_and_nvidia(target: str) -> None:
    from polykernels.kernel_registry import probe

    for kernel in ("layernorm_modulate", "rmsnorm_scale_shift", "qk_rmsnorm"):
        result = probe(kernel, target)
        assert result.compiled, result.detail
        # Read from the binary on this CPU: a norm that spills its rows to the stack is a regression.
        assert result.resources["registers"] > 0 and result.resources["spill_bytes"] == 0, result.detail


X_128 = torch.randn(1, 2, 8, generator=torch.Generator().manual_seed(0))
SHIFT_T = torch.randn(8, 1, generator=torch.Generator().manual_seed(1)).t()  # [1, 8], transposed storage
SCALE_1 = torch.randn(1, 8, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: layernorm_modulate(torch.randn(2, 3, 8), torch.randn(2, 9), torch.randn(2, 8)), ValueError,
         r"shift must be \[B, D\], \[B, 1, D\] or \[B, L, D\] = \[2, 3, 8\].*got \(2, 9\)"),
        (lambda: layernorm_modulate(torch.randn(2, 3, 8), torch.randn(3, 8), torch.randn(3, 8)), ValueError,
         r"shift must be"),
        (lambda: layernorm_modulate(torch.randn(2, 3, 8).half(), torch.randn(2, 8).bfloat16(), torch.randn(2, 8)),
         TypeError, r"shift must be torch.float16 \(like x\) or float32, got torch.bfloat16"),
        (lambda: layernorm_modulate(torch.randn(2, 8, 3).transpose(1, 2), torch.randn(2, 8), torch.randn(2, 8)),
         ValueError, r"x must be contiguous"),
        (lambda: layernorm_modulate(torch.randn(2, 0, 8), torch.randn(2, 8), torch.randn(2, 8)), ValueError,
         r"x is empty"),
        (lambda: layernorm_modulate(torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 8)), ValueError,
         r"x must have 3 dimensions"),
        (lambda: layernorm_modulate(torch.randn(1, 1, 16385), torch.randn(1, 16385), torch.randn(1, 16385)),
         ValueError, r"at most 16384"),
        (lambda: layernorm_modulate(torch.randn(1, 2, 8).double(), torch.randn(1, 8), torch.randn(1, 8)),
         TypeError, r"x must be float32, float16 or bfloat16"),
        # A positive row: its result is checked against the reference on the same values.
        (lambda: (layernorm_modulate(X_128, SHIFT_T, SCALE_1), layernorm_modulate_reference(X_128, SHIFT_T, SCALE_1)),
         None, None),
        (lambda: layernorm_modulate(torch.randn(1, 2, 8), torch.randn(1, 16)[:, ::2], torch.randn(1, 8)),
         ValueError, r"shift's last dimension must be contiguous"),
        (lambda: rmsnorm_scale_shift(torch.randn(1, 2, 8), torch.randn(7), torch.randn(1, 8), torch.randn(1, 8)),
         ValueError, r"weight must have shape \(8,\)"),
        (lambda: qk_rmsnorm(torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 4), torch.randn(8), torch.randn(4)),
         ValueError, r"q and k must share head_dim"),
        (lambda: layernorm_modulate(torch.randn(1, 2, 8), torch.randn(1, 8), torch.randn(1, 8), eps=None),
         ValueError, r"eps must be a finite positive number, got None"),
        (lambda: layernorm_modulate(torch.randn(1, 2, 8), torch.randn(1, 8), torch.randn(1, 8), eps=-1e-6),
         ValueError, r"eps must be a finite positive number, got -1e-06"),
        (lambda: rmsnorm_scale_shift(torch.randn(1, 2, 8), torch.randn(8), torch.randn(1, 8), torch.randn(1, 8),
                                     eps=float("nan")), ValueError, r"eps must be a finite positive number, got nan"),
        (lambda: qk_rmsnorm(torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8), torch.randn(8), torch.randn(8),
                            eps=True), ValueError, r"eps must be a finite positive number, got True"),
    ],
    ids=["bad-shift-D", "bad-batch", "dtype-mix", "non-contiguous", "empty", "2d", "too-wide", "float64",
         "transposed-1xD-ok", "strided-last-dim", "weight-shape", "qk-head-dim", "eps-none", "eps-negative",
         "eps-nan", "eps-bool"],
)
def test_bad_input_names_the_argument(call, error, match) -> None:
    if error is None:
        got, want = call()
        assert got.shape == want.shape and torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        return
    with pytest.raises(error, match=match):
        call()


@pytest.fixture
def eager_plans(monkeypatch: pytest.MonkeyPatch):
    """The eager GPU path of the public ops, on CPU tensors: the Triton interpreter runs the kernels,
    so the launch plans kept per class of call are exercised with real results."""
    from polykernels.norm import ops

    monkeypatch.setattr(ops, "_eager_gpu", lambda x: True)
    monkeypatch.setattr(ops, "_gpu_path", lambda x, exact_epilogue: "triton")
    ops.forget_plans()
    yield ops._eager_plans
    ops.forget_plans()


def _head_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(1, 3, 2, 16), torch.randn(16)


@pytest.mark.cpu_only
def test_eager_plans_are_kept_per_class_and_give_the_reference(eager_plans: dict) -> None:
    x, weight = torch.randn(2, 3, 32), torch.randn(32)
    shift, scale = modulation(2, 3, 32, "chunked", torch.float32)
    heads, head_weight = _head_inputs()
    calls = [
        (lambda: layernorm_modulate(x, shift, scale), lambda: layernorm_modulate_reference(x, shift, scale)),
        (lambda: rmsnorm_scale_shift(x, weight, shift, scale),
         lambda: rmsnorm_scale_shift_reference(x, weight, shift, scale)),
        (lambda: qk_rmsnorm(heads, heads * 2, head_weight, head_weight)[1],
         lambda: qk_rmsnorm_reference(heads, heads * 2, head_weight, head_weight)[1]),
        (lambda: head_rmsnorm(heads, head_weight), lambda: qk_rmsnorm_reference(heads, heads, head_weight,
                                                                                head_weight)[0]),
    ]
    for planned, (call, reference) in enumerate(calls, start=1):
        for _ in range(2):  # the second call runs from the plan the first one kept
            torch.testing.assert_close(call(), reference(), rtol=1e-5, atol=1e-5)
        assert len(eager_plans) == planned
    layernorm_modulate(x[:, :2].contiguous(), shift, scale)  # another class: another plan
    assert len(eager_plans) == len(calls) + 1


@pytest.mark.cpu_only
@pytest.mark.parametrize(
    ("bad_call", "error", "match"),
    [
        (lambda x, w, s, c, h, hw: layernorm_modulate(x.transpose(1, 2).contiguous().transpose(1, 2), s, c),
         ValueError, r"x must be contiguous"),
        (lambda x, w, s, c, h, hw: layernorm_modulate(x, s.bfloat16(), c), TypeError, r"shift must be torch.float32"),
        (lambda x, w, s, c, h, hw: layernorm_modulate(x, s, c, eps=True), ValueError, r"got True"),
        (lambda x, w, s, c, h, hw: layernorm_modulate(x, s, c, eps=-1e-6), ValueError, r"got -1e-06"),
        (lambda x, w, s, c, h, hw: layernorm_modulate(x, s, c, eps=float("nan")), ValueError, r"got nan"),
        (lambda x, w, s, c, h, hw: layernorm_modulate(x, torch.randn(2, 64)[:, ::2], c), ValueError,
         r"shift's last dimension must be contiguous"),
        (lambda x, w, s, c, h, hw: rmsnorm_scale_shift(x, w[:31], s, c), ValueError, r"weight must have shape"),
        (lambda x, w, s, c, h, hw: rmsnorm_scale_shift(x, w.double(), s, c), TypeError, r"weight must be a float"),
        (lambda x, w, s, c, h, hw: qk_rmsnorm(h, h[..., :8].contiguous(), hw, hw[:8]), ValueError,
         r"q and k must share head_dim"),
        (lambda x, w, s, c, h, hw: head_rmsnorm(h.double(), hw), TypeError, r"x must be float32"),
    ],
    ids=["non-contiguous", "shift-dtype", "eps-bool", "eps-negative", "eps-nan", "strided-shift", "weight-shape",
         "weight-dtype", "qk-head-dim", "head-dtype"],
)
def test_a_kept_plan_never_skips_a_check(eager_plans: dict, bad_call, error, match) -> None:
    # Good calls of the same shapes first: each bad call differs from one of them in one fact only.
    x, weight = torch.randn(2, 3, 32), torch.randn(32)
    shift, scale = torch.randn(2, 32), torch.randn(2, 32)
    heads, head_weight = _head_inputs()
    layernorm_modulate(x, shift, scale, eps=1.0)
    layernorm_modulate(x, shift, scale)
    rmsnorm_scale_shift(x, weight, shift, scale)
    qk_rmsnorm(heads, heads, head_weight, head_weight)
    head_rmsnorm(heads, head_weight)
    assert len(eager_plans) == 5
    with pytest.raises(error, match=match):
        bad_call(x, weight, shift, scale, heads, head_weight)


def test_torch_compile_traces_the_ops() -> None:
    x, shift, scale = torch.randn(2, 4, 32), torch.randn(2, 32), torch.randn(2, 32)
    compiled = torch.compile(lambda a: layernorm_modulate(a, shift, scale) + 1, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), layernorm_modulate(x, shift, scale) + 1)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "dim"),
    [(torch.bfloat16, 3072), (torch.bfloat16, 16384), (torch.float32, 3072), (torch.float16, 5000),
     (torch.bfloat16, 128)],
    ids=lambda v: str(v).removeprefix("torch."),
)
def test_gpu_paths_match_reference(gpu_device: str, dtype: torch.dtype, dim: int) -> None:
    x = torch.randn(2, 257, dim, device=gpu_device, dtype=dtype)
    emb = torch.randn(2, 6 * dim, device=gpu_device, dtype=dtype)
    shift, scale = emb.chunk(6, dim=1)[:2]
    weight = torch.randn(dim, device=gpu_device, dtype=dtype)
    for preference in ("auto", "portable"):
        with prefer(preference):
            got = layernorm_modulate(x, shift, scale)
            assert relative_rms_error(got, layernorm_modulate_reference(x, shift, scale)) < TOLERANCE[dtype]
            got = rmsnorm_scale_shift(x, weight, shift, scale)
            want = rmsnorm_scale_shift_reference(x, weight, shift, scale)
            assert relative_rms_error(got, want) < TOLERANCE[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_gpu_ptx_epilogue_is_bit_exact_with_eager_fp32(gpu_device: str, rms: bool) -> None:
    # What the PTX path buys, proven: given the kernel's own statistics, its output is
    # bit-identical to PyTorch eager's fp32 arithmetic (separately rounded mul/add, IEEE rstd);
    # the portable path's FMA contraction is not.
    if not platform.has_inline_ptx():
        pytest.fail("this GPU test needs an NVIDIA GPU")
    dim = 3072
    x = torch.randn(1, 4608, dim, device=gpu_device)
    shift, scale = torch.randn(1, dim, device=gpu_device), torch.randn(1, dim, device=gpu_device)
    weight = torch.randn(dim, device=gpu_device) if rms else None
    mismatches = {}
    for exact in (True, False):
        y, mean, rstd = _launch_norm(x, weight, shift, scale, 1e-6, exact=exact, stats=True)
        centered = x - mean.view(1, -1, 1)
        normed = centered * rstd.view(1, -1, 1)
        if rms:
            normed = normed * weight
        eager = normed * (1 + scale[:, None]) + shift[:, None]
        mismatches[exact] = int((y != eager).sum())
    assert mismatches[True] == 0
    # The claim that the portable path is NOT bit-exact (FMA contraction) is asserted too: if it
    # ever were, the PTX specialization would have no reason to exist.
    assert mismatches[False] > 0, "the portable path matched eager fp32 bit for bit: is the PTX path still needed?"
