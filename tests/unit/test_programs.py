"""Launch programs (polykernels._programs, csrc/launch/program.cu): a class of call's Triton launches
recorded from the checked Python path and replayed from C++.

The encoding and the class's bookkeeping run anywhere; the replay itself needs the CUDA extension
and a GPU (``gpu``): there each replayed call is compared bit for bit with the checked path's
result on the same inputs (the same kernels, so the same bits)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
import torch

from polykernels import _programs
from polykernels._launch import KernelLaunch, Launcher
from polykernels._programs import OutputPart, Scalar, Step, Zero, _encode, _encode_step, _parameter
from polykernels.gated_delta_rule import chunk_gated_delta_rule, launch


class _DescribedLauncher(Launcher):
    """A Launcher whose compiled kernel is described without compiling one."""

    def __init__(self, types: tuple[str, ...], dependent: bool = False, scratch_bytes: int = 0) -> None:
        self.kernel, self._compiled, self._kernels = None, {}, {}
        self._described = KernelLaunch(function=0xABC, threads=128, shared_bytes=4096, types=types, dependent=dependent,
                                       scratch_bytes=scratch_bytes)

    def described(self, spec_key: object) -> KernelLaunch | None:
        return self._described


def test_parameters_name_their_source() -> None:
    x, y, out, lasting = torch.zeros(4), torch.zeros(4), torch.zeros(4), torch.zeros(1)
    tensors, outputs = [x, None, y], [out]
    assert _parameter(y, "*bf16", tensors, outputs, ()) == (_programs._INPUT, 2, 0)
    assert _parameter(out, "*fp32", tensors, outputs, ()) == (_programs._OUTPUT, 0, 0)
    assert _parameter(OutputPart(1, 512), "*i64", tensors, outputs, ()) == (_programs._OUTPUT, 1, 512)
    assert _parameter(lasting, "*fp32", tensors, outputs, (lasting,)) == (_programs._CONSTANT, lasting.data_ptr(), 0)
    assert _parameter(-3, "i32", tensors, outputs, ()) == (_programs._CONSTANT, -3, 0)
    assert _parameter(2**40, "i64", tensors, outputs, ()) == (_programs._CONSTANT, 2**40, 0)
    assert _parameter(2**64 - 1, "u64", tensors, outputs, ()) == (_programs._CONSTANT, -1, 0)
    assert _parameter(Scalar(0), "fp32", tensors, outputs, ()) == (_programs._SCALAR_F32, 0, 0)
    bits = struct.unpack("<I", struct.pack("<f", 0.125))[0]
    assert _parameter(0.125, "fp32", tensors, outputs, ()) == (_programs._CONSTANT, bits, 0)


@pytest.mark.parametrize(("arg", "kind"), [(torch.zeros(2), "*fp32"), (12345, "*fp32"), (1.5, "i32"), (1.0, "fp16"),
                                           (Scalar(0), "i64"), (None, "*fp32")],
                         ids=["a-tensor-of-no-slot", "an-address", "float-as-int", "fp16", "scalar-as-int", "none"])
def test_parameters_that_cannot_be_replayed_are_refused(arg: object, kind: str) -> None:
    assert _parameter(arg, kind, [torch.zeros(1)], [torch.zeros(1)], ()) is None


def test_a_launch_encodes_its_kernel_grid_and_runtime_parameters() -> None:
    x, out = torch.zeros(8), torch.zeros(8)
    launcher = _DescribedLauncher(("*fp32", "i32", "constexpr", "*fp32", "fp32", "constexpr"))
    code = _encode(Step(launcher, (3, 2), (x, 8, 1, out, Scalar(0)), "key"), [x], [out], ())
    assert code == [0xABC, 3, 2, 1, 128, 4096, 4,
                    _programs._INPUT, 0, 0, _programs._CONSTANT, 8, 0, _programs._OUTPUT, 0, 0,
                    _programs._SCALAR_F32, 0, 0]


def test_a_kernel_with_global_scratch_takes_its_address_after_its_own_parameters() -> None:
    x, out = torch.zeros(8), torch.zeros(8)
    launcher = _DescribedLauncher(("*fp32", "constexpr"), scratch_bytes=1024)
    code = _encode(Step(launcher, (4,), (x, 1), "key", OutputPart(0, 2048)), [x], [out], ())
    # The driver reads the parameter after the kernel's own as its global scratch (csrc/launch/driver.h).
    assert code == [0xABC, 4, 1, 1, 128, 4096, 2, _programs._INPUT, 0, 0, _programs._OUTPUT, 0, 2048]
    assert _encode(Step(launcher, (4,), (x, 1), "key"), [x], [out], ()) is None  # no part for it: not recorded


def test_every_step_leads_with_its_kind() -> None:
    x, out = torch.zeros(8), torch.zeros(8)
    launch = [0xABC, 1, 1, 1, 128, 4096, 1, _programs._INPUT, 0, 0]
    plain, dependent = _DescribedLauncher(("*fp32",)), _DescribedLauncher(("*fp32",), dependent=True)
    assert _encode_step(Step(plain, (1,), (x,), "key"), [x], [out], ()) == [_programs._LAUNCH, *launch]
    assert _encode_step(Step(dependent, (1,), (x,), "key"), [x], [out], ()) == [_programs._DEPENDENT_LAUNCH, *launch]
    assert _encode_step(Zero(0, 256, 64), [x], [out], ()) == [_programs._ZERO, 0, 256, 64]


def test_steps_of_other_launchers_or_unknown_tensors_are_not_recorded() -> None:
    x, out = torch.zeros(8), torch.zeros(8)
    launcher = _DescribedLauncher(("*fp32", "*fp32"))
    assert _encode(Step(lambda *a, **k: None, (1,), (x, out), "key"), [x], [out], ()) is None
    assert _encode(Step(launcher, (1,), (x, torch.zeros(8)), "key"), [x], [out], ()) is None


@pytest.fixture(autouse=True)
def _no_programs_from_other_tests() -> None:
    """Each test starts with no program registered (the same class may have run in another test)."""
    _programs.clear()


@pytest.mark.gpu
def test_gpu_a_launcher_describes_its_kernel_after_the_first_launch_only(gpu_device: str) -> None:
    from polykernels.gated_delta_rule import kernels

    launcher = Launcher(kernels.gdn_combine_kernel)
    # One sequence of one segment: the scan stores the initial state as the segment's.
    h0, h_local, transition, h_init = (torch.randn(1, 1, 16, 16, device="cuda") for _ in range(4))
    cu = torch.tensor([0, 64], dtype=torch.int64, device="cuda")
    args = (h0, h_local, transition, h_init, cu, 1, 1, 2**40)
    meta = {"HV": 1, "K": 16, "V": 16, "BK": 16, "BV": 16, "KB": 16, "HAS_INITIAL": True, "VARLEN": False,
            "DOT_PRECISION": "ieee", "num_warps": 4, "num_stages": 1}
    assert launcher.described("combine") is None
    launcher((1, 1, 1), args, meta, spec_key="combine")
    described = launcher.described("combine")
    assert described is not None and described.threads == 128 and described.function != 0
    assert described.types[:5] == ("*fp32",) * 4 + ("*i64",) and described.types[-1] == "constexpr"
    torch.testing.assert_close(h_init, h0, rtol=0, atol=0)


def test_the_launch_tables_are_read_only_and_replacing_one_moves_the_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError):
        launch.HOPPER_STAGES[32] = 2  # type: ignore[index]
    before = launch.configuration_version
    monkeypatch.setattr(launch, "HOPPER_STAGES", {32: 2})
    assert launch.configuration_version == before + 1
    monkeypatch.undo()
    assert launch.configuration_version == before + 2 and launch.HOPPER_STAGES[32] == 3


def _gdn_inputs(tokens: int, heads: int, value_heads: int, dtype: torch.dtype, seed: int,
                *, dim: int = 128) -> SimpleNamespace:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, tokens, heads, dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(1, tokens, heads, dim, device="cuda", generator=gen), dim=-1)
    v = torch.randn(1, tokens, value_heads, dim, device="cuda", dtype=dtype, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, tokens, value_heads, device="cuda", generator=gen))
    beta = torch.rand(1, tokens, value_heads, device="cuda", generator=gen)
    return SimpleNamespace(q=q, k=k.to(dtype), v=v, g=g, beta=beta)


class _RunCounter:
    """Counts the calls that a launch program served."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.served, real = 0, _programs.run

        def counted(*args: object) -> list[torch.Tensor] | None:
            outputs = real(*args)
            self.served += outputs is not None
            return outputs

        monkeypatch.setattr(_programs, "run", counted)


def _checked_path(x: SimpleNamespace, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same call through the Python launch path, never a program."""
    scale = kwargs.pop("scale", None) or x.q.shape[-1] ** -0.5
    return launch.launch_chunk_gated_delta_rule(
        x.q, x.k, x.v, x.g, x.beta, scale, kwargs.pop("initial_state", None),
        kwargs.pop("output_final_state", False), kwargs.pop("cu_seqlens", None),
        kwargs.pop("use_qk_l2norm_in_kernel", False), kwargs.pop("num_segments", None))


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "heads", "value_heads", "dtype", "options"), [
    (1000, 2, 8, torch.bfloat16, {"output_final_state": True}),
    (700, 4, 4, torch.float16, {"use_qk_l2norm_in_kernel": True, "scale": 0.3}),
    (1500, 2, 8, torch.bfloat16, {"num_segments": 3, "output_final_state": True, "initial_state": True}),
    (1200, 2, 4, torch.bfloat16, {"cu_seqlens": [0, 500, 500, 501, 1200], "output_final_state": True}),
    (300, 2, 2, torch.float32, {"output_final_state": True}),
], ids=["dense-final", "fp16-l2norm-scale", "segments-initial", "packed", "fp32"])
def test_gpu_replayed_calls_give_the_checked_paths_bits(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                         tokens: int, heads: int, value_heads: int,
                                                         dtype: torch.dtype, options: dict) -> None:
    if not _programs.enabled():
        pytest.fail("the extension's launch programs are not available (build the CUDA extension)")
    counter = _RunCounter(monkeypatch)
    for seed in range(3):
        x = _gdn_inputs(tokens, heads, value_heads, dtype, seed)
        kwargs = dict(options)
        if kwargs.get("initial_state"):
            kwargs["initial_state"] = torch.randn(1, value_heads, 128, 128, device="cuda")
        if "cu_seqlens" in kwargs:
            kwargs["cu_seqlens"] = torch.tensor(kwargs["cu_seqlens"], dtype=torch.int32, device="cuda")
        got = chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, **kwargs)
        want = _checked_path(x, **kwargs)
        assert torch.equal(got[0], want[0])
        assert (got[1] is None) == (want[1] is None) and (got[1] is None or torch.equal(got[1], want[1]))
    assert counter.served == 2, "the first call registers the class, the next two are replayed"


@pytest.mark.gpu
def test_gpu_a_changed_class_or_configuration_is_not_replayed(gpu_device: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _RunCounter(monkeypatch)
    x = _gdn_inputs(640, 2, 4, torch.bfloat16, 0)
    chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta)
    chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta)
    assert counter.served == 1
    chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, output_final_state=True)  # another flag: registers anew
    longer = _gdn_inputs(704, 2, 4, torch.bfloat16, 0)
    chunk_gated_delta_rule(longer.q, longer.k, longer.v, longer.g, longer.beta)  # another shape
    assert counter.served == 1
    monkeypatch.setattr(launch, "HOPPER_STAGES", {})  # a table replaced: the recorded program is stale
    got = chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta)
    assert counter.served == 1
    assert torch.equal(got[0], _checked_path(x)[0])


@pytest.mark.gpu
def test_gpu_calls_that_clone_or_convert_inputs_are_not_recorded(gpu_device: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _RunCounter(monkeypatch)
    x = _gdn_inputs(512, 2, 4, torch.bfloat16, 0)
    storage = torch.empty(x.q.numel() + 1, dtype=x.q.dtype, device="cuda")
    mid_row = storage[1:].view(x.q.shape)  # 2 bytes past a 16-byte boundary: the Gluon passes copy it
    mid_row.copy_(x.q)
    half_state = torch.zeros(1, 4, 128, 128, device="cuda", dtype=torch.float16)  # converted to fp32 per call
    for _ in range(2):
        chunk_gated_delta_rule(mid_row, x.k, x.v, x.g, x.beta)
        chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=half_state)
    assert counter.served == 0


@pytest.mark.gpu
def test_gpu_replay_still_checks_the_boundaries_of_packed_sequences(gpu_device: str) -> None:
    x = _gdn_inputs(600, 2, 4, torch.bfloat16, 0)
    cu = torch.tensor([0, 200, 600], dtype=torch.int32, device="cuda")
    for _ in range(2):
        chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=cu)
    bad = torch.tensor([0, 400, 300], dtype=torch.int32, device="cuda")  # the same class, wrong values
    with pytest.raises(ValueError, match="cu_seqlens must"):
        chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=bad)


@pytest.mark.gpu
def test_gpu_a_replayed_call_is_captured_in_a_cuda_graph(gpu_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _RunCounter(monkeypatch)
    x = _gdn_inputs(1000, 2, 8, torch.bfloat16, 0)
    want = chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, output_final_state=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, output_final_state=True)
    assert counter.served == 1
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize(("code", "match"), [
    ([], "the program is empty"), ([1, 0, 0, 1, 1], "ends inside a launch"),
    ([1, 0, 0, 1, 1, 1, 128, 0, 1, 9, 0, 0], "unknown parameter source 9"),
    ([1, 0, 0, 1, 1, 1, 128, 0, 1, 0, 5, 0], "names tensor 5"),
    ([1, 0, 0, 0, 1, 1, 128, 0, 0], "grid dimension 0 is 0"),
    ([1, 7], "unknown step 7"), ([1, 1, 0, 1, 1, 1, 128, 0, 0], "a dependent launch must follow a launch"),
    ([1, 2, 5, 0, 16], "names output 5"), ([1, 2, 0, 8, 12], "of 12 bytes from 8 overruns output 0 \\(16 bytes\\)"),
], ids=["empty", "short", "unknown-source", "no-such-tensor", "zero-grid", "unknown-step", "dependent-first",
        "zero-no-such-output", "zero-past-the-output"])
def test_gpu_a_malformed_program_is_refused_by_name(gpu_device: str, code: list[int], match: str) -> None:
    if not _programs.enabled():
        pytest.fail("the extension's launch programs are not available (build the CUDA extension)")
    x = torch.zeros(4, device="cuda")
    with pytest.raises(RuntimeError, match=match):
        torch.ops.polykernels.program_register.default([x], [99], [x], 1, code)



@pytest.mark.gpu
@pytest.mark.parametrize("change", [None, "cpu", "flag-int", "segments-float", "k-list", "programs-off"])
def test_gpu_calls_no_program_may_serve_have_no_class(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                      change: str | None) -> None:
    from polykernels.gated_delta_rule import chunk

    q = torch.zeros(1, 64, 2, 16, device="cpu" if change == "cpu" else "cuda")
    args = {"q": q, "k": q, "v": q, "g": q[..., 0], "beta": q[..., 0], "initial_state": None,
            "output_final_state": True, "cu_seqlens": None, "use_qk_l2norm_in_kernel": False, "num_segments": None}
    if change == "flag-int":
        args["output_final_state"] = 1
    elif change == "segments-float":
        args["num_segments"] = 2.0
    elif change == "k-list":
        args["k"] = [q]
    elif change == "programs-off":
        monkeypatch.setattr(_programs, "enabled", lambda: False)
    found = chunk._replay_class(**args)
    # The unchanged call has a class; each change must reach the checked path (its errors, the CPU path).
    assert (found is not None) if change is None else (found is None)


@pytest.mark.parametrize(("options", "launches"), [
    ({}, ["prepare", "recurrence"]),
    ({"num_segments": 2}, ["prepare", "segment_state", "combine", "recurrence"]),
    ({"cu_seqlens": torch.tensor([0, 40, 128])}, ["prepare", "recurrence"]),
    ({"initial_state": torch.zeros(1, 4, 16, 16)}, ["prepare", "recurrence"]),
    ({"initial_state": torch.zeros(1, 4, 16, 16, dtype=torch.float16)}, None),
], ids=["dense", "segments", "packed", "fp32-initial", "fp16-initial-converted"])
def test_the_checked_path_records_its_own_launches(monkeypatch: pytest.MonkeyPatch, options: dict,
                                                   launches: list[str] | None) -> None:
    # The Python side of recording, in the interpreter: which launches a call hands to the extension,
    # with which tensors; a call that converts an input records nothing.
    recorded = []
    monkeypatch.setattr(_programs, "register", lambda *args, **kwargs: recorded.append((args, kwargs)))
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 128, 2, 16, generator=gen), torch.randn(1, 128, 2, 16, generator=gen)
    v = torch.randn(1, 128, 4, 16, generator=gen)
    g, beta = -torch.rand(1, 128, 4, generator=gen), torch.rand(1, 128, 4, generator=gen)
    initial, cu = options.get("initial_state"), options.get("cu_seqlens")
    if cu is not None:
        initial = None
    tensors, flags = [q, k, v, g, beta, initial, cu], [1, 0, 1, 0, options.get("num_segments", 0)]
    o, final = launch.launch_chunk_gated_delta_rule(q, k, v, g, beta, 0.25, initial, True, cu, False,
                                                    options.get("num_segments"), replay=(tensors, flags))
    if launches is None:
        assert recorded == []
        return
    (args, kwargs), = recorded
    got_tensors, got_flags, outputs, returned, steps = args
    assert got_tensors is tensors and got_flags is flags and returned == 2
    assert outputs[0] is o and outputs[1] is final and outputs[2].dtype == torch.uint8
    assert kwargs["constants"][0].device == q.device
    named = {id(launch._launchers().prepare): "prepare", id(launch._launchers().combine): "combine"}
    kinds = [named.get(id(step.launcher), "sequential") for step in steps]
    expected = ["sequential" if name in ("segment_state", "recurrence") else name for name in launches]
    assert kinds == expected
    for step in steps:  # the scale is a per-call scalar; the workspace's parts are marked, not addresses
        assert not any(isinstance(arg, float) for arg in step.args)
        assert all(isinstance(arg, (torch.Tensor, int, OutputPart, Scalar)) for arg in step.args)
        assert all(any(arg is t for t in (*tensors, o, final, *kwargs["constants"]))
                   for arg in step.args if isinstance(arg, torch.Tensor))
