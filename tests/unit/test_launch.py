"""polykernels._launch: the direct launch path's fallback when a device's shared memory is smaller
than the launch tables assume. The real OutOfResources needs a GPU (the fp32 gated-delta-rule GPU
test meets it on the H200); here a stand-in kernel raises it as Triton does, before launching."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from triton.runtime.errors import OutOfResources

from polykernels._launch import Launcher, _args_key


class _KernelNeedingStages:
    """Indexes and calls like a JITFunction; raises Triton's error above ``fits`` pipeline stages."""

    def __init__(self, fits: int, resource: str = "shared memory") -> None:
        self.fits, self.resource, self.stages_tried = fits, resource, []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., str]:
        def launch(*args: object, **meta: object) -> str:
            self.stages_tried.append(meta["num_stages"])
            if meta["num_stages"] > self.fits:
                raise OutOfResources(262656, 232448, self.resource)
            return "launched"

        return launch


def test_launch_drops_stages_until_the_shared_memory_fits() -> None:
    kernel = _KernelNeedingStages(fits=1)
    assert Launcher(kernel)._launch_fitting((1,), (), {"BLOCK": 64, "num_stages": 3}) == "launched"
    assert kernel.stages_tried == [3, 2, 1]


@pytest.mark.parametrize(("fits", "resource"), [(0, "shared memory"), (1, "registers")])
def test_launch_reraises_what_fewer_stages_cannot_fix(fits: int, resource: str) -> None:
    kernel = _KernelNeedingStages(fits=fits, resource=resource)
    with pytest.raises(OutOfResources, match=resource):
        Launcher(kernel)._launch_fitting((1,), (), {"num_stages": 2})


class _KeyRecorder:
    """Stands for a Launcher: records each call's spec_key beside the key derived from every argument."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, tuple]] = []

    def __call__(self, grid: tuple[int, ...], args: tuple, meta: dict, *, spec_key: object = None,
                 tensors: Callable[[], tuple] | None = None, device: int | None = None) -> None:
        assert spec_key is not None, "every eager launch passes its spec_key"
        # What Triton specializes on: the tensors, where the call passes some as addresses.
        self.calls.append((spec_key, (*meta.values(), _args_key(tensors() if tensors is not None else args))))


def _assert_spec_keys_decide_the_specialization(calls: list[tuple[object, tuple]]) -> None:
    # A cached kernel is reused for every call with the same spec_key: the key derived from the
    # arguments (what Triton specializes on) must then be the same too.
    derived: dict[object, tuple] = {}
    for spec, key in calls:
        assert derived.setdefault(spec, key) == key, f"spec_key {spec} covers two specializations"
    assert len(set(derived.values())) > 1  # the cases do reach different specializations


def _misaligned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    flat = torch.randn(math.prod(shape) + 1).to(dtype)
    return flat[1:].view(shape)  # a 2- or 4-byte offset: not 16-byte aligned


def test_norm_spec_keys_decide_the_specialization(monkeypatch: pytest.MonkeyPatch) -> None:
    from polykernels.norm import ops

    recorder = _KeyRecorder()
    monkeypatch.setattr(ops, "_launchers", lambda: SimpleNamespace(norm=recorder, qk=recorder))
    for (batch, tokens, dim), dtype in itertools.product([(1, 1, 64), (2, 16, 64), (2, 17, 48)],
                                                         [torch.bfloat16, torch.float32]):
        xs = [torch.randn(batch, tokens, dim).to(dtype), _misaligned((batch, tokens, dim), dtype)]
        emb = torch.randn(batch, 3 * dim + 1).to(dtype)
        modulations = [
            (torch.randn(batch, dim).to(dtype), torch.randn(batch, 1, dim)),
            (emb[:, :dim], emb[:, dim:2 * dim]),  # chunks of one projection, as AdaLayerNormZero's
            (emb[:, 1:dim + 1], emb[:, dim + 1:2 * dim + 1]),  # misaligned chunks
            (torch.randn(batch, tokens, dim).to(dtype), torch.randn(batch, tokens, dim).to(dtype)),
        ]
        for x, (shift, scale), weight, exact in itertools.product(
            xs, modulations, [None, torch.randn(dim).to(dtype)], [False, True]
        ):
            ops._launch_norm(x, weight, shift, scale, 1e-6, exact, stats=exact)
        for q in xs:
            q4 = q.view(batch, tokens, 1, dim)
            ops._launch_qk(q4, q4, torch.randn(dim), torch.randn(dim).to(dtype), 1e-6, only_q=False, traced=False)
            ops._launch_qk(q4, q4, torch.randn(dim), torch.randn(dim), 1e-6, only_q=True, traced=False)
    _assert_spec_keys_decide_the_specialization(recorder.calls)


def test_gated_delta_rule_spec_keys_decide_the_specialization(monkeypatch: pytest.MonkeyPatch) -> None:
    from polykernels.gated_delta_rule import launch

    recorders = SimpleNamespace(prepare=_KeyRecorder(), recurrence=_KeyRecorder(),
                                combine=_KeyRecorder())
    monkeypatch.setattr(launch, "_launchers", lambda: recorders)
    cases = itertools.product(
        [(1, 63, 2, 4, 32, 32), (2, 64, 1, 2, 16, 48), (1, 200, 1, 1, 32, 32)],
        [torch.bfloat16, torch.float32], [None, torch.int32, torch.int64], [False, True], [None, 3], [False, True],
        [False, True], [torch.float32, torch.bfloat16],
    )
    for shape, dtype, cu_dtype, initial, segments, misaligned, final, g_dtype in cases:
        batch, tokens, heads, value_heads, key_dim, value_dim = shape
        if cu_dtype is not None and batch != 1:
            continue
        make = _misaligned if misaligned else (lambda shape, dt: torch.randn(shape).to(dt))
        q = make((batch, tokens, heads, key_dim), dtype)
        k = torch.randn(batch, tokens, heads, key_dim).to(dtype)
        v = torch.randn(batch, tokens, value_heads, value_dim).to(dtype)
        g = -torch.rand(batch, tokens, value_heads).to(g_dtype)
        beta = make((batch, tokens, value_heads), torch.bfloat16)
        cu = None if cu_dtype is None else torch.tensor([0, tokens // 3, tokens], dtype=cu_dtype)
        num_seqs = batch if cu is None else 2
        h0 = torch.randn(num_seqs, value_heads, key_dim, value_dim) if initial else None
        launch.launch_chunk_gated_delta_rule(q, k, v, g, beta, key_dim**-0.5, h0, final, cu, True, segments)
    for name in ("prepare", "recurrence", "combine"):
        _assert_spec_keys_decide_the_specialization(getattr(recorders, name).calls)


class _RecordingKernel:
    """Indexes and calls like a JITFunction (an interpreted one: not a JITFunction); records the arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., str]:
        return lambda *args, **meta: self.calls.append(args) or "launched"


def test_an_interpreted_launch_gets_tensors_in_place_of_addresses() -> None:
    kernel, view = _RecordingKernel(), torch.zeros(3)
    Launcher(kernel)((1,), (view.data_ptr(), 5), {}, spec_key=1, tensors=lambda: (view, 5))
    assert kernel.calls == [(view, 5)]


def test_tritons_own_launch_gets_tensors_in_place_of_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel, view = _RecordingKernel(), torch.zeros(3)
    launcher = Launcher(kernel)
    launcher._interpreted = False  # as for a JITFunction on a GPU: the first call of a key is Triton's own
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    launcher((1,), (view.data_ptr(), 5), {"num_stages": 1}, spec_key=1, tensors=lambda: (view, 5))
    assert kernel.calls == [(view, 5)]
    with pytest.raises(ValueError, match="must pass spec_key"):
        launcher((1,), (view.data_ptr(), 5), {"num_stages": 1}, tensors=lambda: (view, 5))


class CudaLauncher:
    """Stands for Triton 3.6's CUDA launcher (matched by class name): records what its C function gets."""

    def __init__(self, scratch: int = 0) -> None:
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.c_calls: list[tuple] = []
        self.python_calls: list[tuple] = []
        self.launch = lambda *args: self.c_calls.append(args)

    def __call__(self, *args: object) -> None:
        self.python_calls.append(args)


def _compiled(run: object) -> SimpleNamespace:
    return SimpleNamespace(run=run, function=1234, packed_metadata=(4, 1, 0))


def test_the_cuda_launch_passes_tensors_as_addresses_to_the_c_function() -> None:
    from polykernels._launch import triton_direct_launch

    run = CudaLauncher()
    x = torch.arange(4.0)
    triton_direct_launch(_compiled(run), (64, True))(3, 1, 1, 77, (x, None, 5, 0.5))
    assert run.python_calls == []
    assert run.c_calls == [(3, 1, 1, 77, 1234, False, True, None, None, (4, 1, 0), None, None, None,
                            x.data_ptr(), None, 5, 0.5, 64, True)]


def test_the_direct_launch_of_a_spec_key_is_kept_after_its_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    run = CudaLauncher()

    class _CompilingKernel:
        arg_names, constexprs = ["x"], []  # one runtime argument, no constexprs

        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., SimpleNamespace]:
            return lambda *args, **meta: _compiled(run)

    launcher = Launcher(_CompilingKernel())
    launcher._interpreted = False
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    assert launcher.cached("spec") is None
    launcher((2,), (7,), {"num_stages": 1}, spec_key="spec")
    direct = launcher.cached("spec")
    assert direct is not None and launcher.cached("other") is None
    direct(2, 1, 1, 77, (8,))
    assert run.c_calls[-1][-1] == 8  # the kept launch goes to the C function with this call's arguments


def test_a_launch_for_another_gpu_runs_under_that_gpus_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    run = CudaLauncher()
    entered: list[int] = []
    current = [0]

    class _Guard:
        def __init__(self, index: int) -> None:
            self.index, self.before = index, current[0]

        def __enter__(self) -> None:
            entered.append(self.index)
            current[0] = self.index

        def __exit__(self, *exc: object) -> None:
            current[0] = self.before

    class _CompilingKernel:
        arg_names, constexprs = ["x"], []

        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., SimpleNamespace]:
            return lambda *args, **meta: _compiled(run)

    launcher = Launcher(_CompilingKernel())
    launcher._interpreted = False
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: current[0], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 100 + device, raising=False)
    monkeypatch.setattr(torch.cuda, "device", _Guard)
    launcher((2,), (7,), {"num_stages": 1}, spec_key="spec", device=1)  # compiles under GPU 1's guard
    launcher((2,), (8,), {"num_stages": 1}, spec_key="spec", device=1)  # the kept launch, GPU 1's stream
    assert entered == [1, 1] and current == [0]
    assert [(call[3], call[-1]) for call in run.c_calls] == [(101, 8)]  # launched on GPU 1's stream
    assert launcher.cached("spec") is None  # kept for GPU 1 only: GPU 0 has compiled nothing for it
    launcher((2,), (9,), {"num_stages": 1}, spec_key="spec", device=0)  # the current GPU: no guard
    assert entered == [1, 1] and launcher.cached("spec") is not None


class _OtherLauncher:
    """A launcher of another backend or release (HIP's, say): only its own call is known."""

    def __init__(self) -> None:
        self.python_calls: list[tuple] = []

    def __call__(self, *args: object) -> None:
        self.python_calls.append(args)


def test_any_other_launch_goes_through_the_launchers_own_call() -> None:
    from polykernels._launch import triton_direct_launch

    run = _OtherLauncher()
    x = torch.arange(4.0)
    triton_direct_launch(_compiled(run), (64,))(2, 1, 1, 77, (x, 5))
    assert run.python_calls == [(2, 1, 1, 77, 1234, (4, 1, 0), None, None, None, x, 5, 64)]


def test_a_kernel_with_global_scratch_gets_the_callers_address_in_the_scratch_slot() -> None:
    from polykernels._launch import triton_direct_launch

    run = CudaLauncher(scratch=1024)
    x = torch.arange(4.0)
    triton_direct_launch(_compiled(run), (64,))(2, 1, 1, 77, (x, 5, 0xBEEF00))  # the scratch: the last argument
    assert run.python_calls == []  # Triton's own call would allocate it through an allocator the library never sets
    assert run.c_calls == [(2, 1, 1, 77, 1234, False, True, 0xBEEF00, None, (4, 1, 0), None, None, None,
                            x.data_ptr(), 5, 64)]
    other = _OtherLauncher()
    other.global_scratch_size = 1024
    with pytest.raises(RuntimeError, match="global scratch needs Triton's CUDA launcher, got _OtherLauncher"):
        triton_direct_launch(_compiled(other), (64,))


def test_a_launch_with_global_scratch_compiles_without_launching_then_launches_directly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = CudaLauncher(scratch=1024)
    warmed: list[tuple] = []

    class _CompilingKernel:
        arg_names, constexprs = ["x"], []

        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., SimpleNamespace]:
            raise AssertionError("a kernel with global scratch must not take Triton's own launch")

        def warmup(self, *args: object, grid: tuple[int, ...], **meta: object) -> SimpleNamespace:
            warmed.append(args)
            return _compiled(run)

    launcher = Launcher(_CompilingKernel())
    launcher._interpreted = False
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)
    for x in (7, 8):
        launcher((2,), (x,), {"num_stages": 1}, spec_key="spec", tensors=lambda x=x: (x,), scratch=(0xF00, 1024))
    assert warmed == [(7,)]  # compiled once
    assert [call[7] for call in run.c_calls] == [0xF00, 0xF00] and [call[-1] for call in run.c_calls] == [7, 8]
    assert launcher.scratch_bytes("spec") == 1024 and launcher.scratch_bytes("other") == 0
    with pytest.raises(RuntimeError, match="1024 bytes of global scratch a program; the caller holds 512"):
        launcher((2,), (9,), {"num_stages": 1}, spec_key="spec", tensors=lambda: (9,), scratch=(0xF00, 512))
    assert len(run.c_calls) == 2  # refused before it launched
    with pytest.raises(ValueError, match="global scratch must pass spec_key and tensors"):
        launcher((2,), (7,), {"num_stages": 1}, scratch=(0xF00, 1024))


def test_a_kernel_with_global_scratch_is_described_with_its_bytes_a_program() -> None:
    from polykernels._launch import _plain_launch

    def compiled(scratch: int | None, profile: int = 0) -> SimpleNamespace:
        run = CudaLauncher(scratch=scratch)
        run.profile_scratch_size = profile
        return SimpleNamespace(run=run, function=1234, packed_metadata=(8, 1, 4096),
                               metadata=SimpleNamespace(num_ctas=1),
                               src=SimpleNamespace(signature={"x": "*fp32", "n": "i32"}))

    described = _plain_launch(compiled(1024), dependent_allowed=True)
    assert described is not None and (described.scratch_bytes, described.threads, described.dependent) == (1024, 256,
                                                                                                          True)
    assert _plain_launch(compiled(0), dependent_allowed=True).scratch_bytes == 0
    assert _plain_launch(compiled(0, profile=64), dependent_allowed=True) is None  # profile scratch: not plain


def test_forget_launchers_drops_every_gated_delta_rule_launcher() -> None:
    from polykernels.gated_delta_rule import launch

    factories = (launch._launchers, launch._hopper_launcher, launch._hopper_register_launcher,
                 launch._hopper_prepare_launcher)
    before = [factory() for factory in factories]
    assert [factory() for factory in factories] == before  # kept while nothing is forgotten
    launch.forget_launchers()
    after = [factory() for factory in factories]
    assert all(new is not old for new, old in zip(after, before, strict=True))
