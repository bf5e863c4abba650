"""`polykernels info --gdn`: the segment plan and launches of one shape, from the op's own recipe."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from polykernels import platform
from polykernels.__main__ import main
from polykernels.gated_delta_rule import launch, plan_report
from polykernels.gated_delta_rule.plan_report import GdnShape


@pytest.fixture
def gluon_release(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The Gluon passes' Triton release, whatever this host has (the H200's plan is what is asked for); recipes
    cached under another release are dropped before and after (each assignment to launch, and its undoing, drops
    them)."""
    monkeypatch.setattr(launch, "_triton_release", lambda: "3.6")
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # the lead form's plans (the windows' test sets it)
    yield


def _h200(shape: GdnShape) -> dict[str, object]:
    with platform.use(platform.for_triton_target("cuda:90")):
        return plan_report.report(shape, sms=132)


def test_report_gives_the_recipes_plan_and_launch_order(gluon_release: None) -> None:
    # 1x32768 with 2 qk / 8 v heads on an H200: nine segments of 57 chunks, the lead form after the prepare pass.
    row = _h200(GdnShape(1, 32768, 2, 8))
    assert (row["path"], row["segments"], row["segment_chunks"], row["v_tile"]) == ("triton", 9, 57, 64)
    assert row["plan"] == launch.plan_segments(1, 32768, 8, 132, register_tiles=(64,), lead_tiles={64: 8}).reason
    assert [line.split(":")[0] for line in row["launches"]] == [
        "prepare pass", "first segments' output pass (the lead)", "segment-state pass", "output pass"]
    assert "programmatic dependent" in row["launches"][2] and "grid (4, 7, 8)" in row["launches"][2]
    # Packed sequences: the bound's 15-chunk segments; uncut ones beside the prepare pass, launched first.
    packed = _h200(GdnShape(2, 8192, 2, 8, packed=True))
    assert packed["segment_chunks"] == 15 and "packed sequences in segments of 15 chunks" in packed["plan"]
    wide = _h200(GdnShape(1, 32768, 32, 32))
    assert wide["launches"][0].startswith("output pass") and "ready flag" in wide["launches"][0]
    assert "every sequence's chunk c before any sequence's chunk c + 1" in wide["launches"][1]  # kernels._ready_slot
    assert "ready flag" not in row["launches"][0]  # alone, it raises none
    # The prepare pass's inverse: its first levels per warp where it runs alone; beside the output pass the
    # GPU's DRAM decides, not known in a preview (whole), and fewer qk heads than value heads take them.
    assert "inside each warp" in row["launches"][0] and "inside each warp" not in wide["launches"][1]
    assert wide["inverse_beside"].startswith("whole levels") and "not known" in wide["inverse_beside"]
    assert "inverse_beside" not in row  # the prepare pass runs alone there
    gva = _h200(GdnShape(1, 32768, 16, 32))
    assert "inside each warp" in gva["launches"][1] and "fewer qk heads (16)" in gva["inverse_beside"]
    assert "the prepare pass's inverse: per-warp levels" in plan_report.render(gva)
    pairs = _h200(GdnShape(8, 4096, 32, 32))  # the pairs form v_new from the T the prepare pass stores
    assert "stores T" in pairs["launches"][0] and "inside each warp" in pairs["launches"][0]
    assert pairs["launches"][1].endswith(", T, k, q and v copied by TMA")
    with pytest.MonkeyPatch.context() as tables:
        tables.setattr(launch, "HOPPER_PAIRS_TMA", False)
        assert _h200(GdnShape(8, 4096, 32, 32))["launches"][1] + ", T, k, q and v copied by TMA" == pairs["launches"][1]
    text = plan_report.render(packed)
    assert "2 packed sequences, 8192 tokens in all" in text and "  4. output pass: grid (2, 8, 8)" in text


def test_report_names_the_segment_windows(gluon_release: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", True)
    # launch.HOPPER_WINDOWED_PAIRS: B1 T32768 32/32 in four segments of pairs, both sequential passes from T and v.
    pairs = _h200(GdnShape(1, 32768, 32, 32))
    assert (pairs["segments"], pairs["segment_chunks"], pairs["v_tile"]) == (4, 128, 128)
    assert "32 sequential programs of two 64-column tiles" in pairs["plan"] and "below 2^-30" in pairs["plan"]
    assert [line.split(":")[0] for line in pairs["launches"]] == ["prepare pass", "segment-state pass", "output pass"]
    assert "v_new from T and v" in pairs["launches"][1] and "P from q and k" not in pairs["launches"][1]
    assert "v_new from T and v and P from q and k" in pairs["launches"][2]
    assert "back to the last window" in pairs["launches"][2] and "the output pass forms the scores" in pairs[
        "launches"][0]
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {})  # the one-tile windows
    row = _h200(GdnShape(1, 65536, 2, 8))  # eight segments of 128 chunks, no lead form
    assert (row["segments"], row["segment_chunks"]) == (8, 128) and "below 2^-30" in row["plan"]
    # No initial state: the output programs scan the segment states back to the last window (no combine pass).
    assert [line.split(":")[0] for line in row["launches"]] == ["prepare pass", "segment-state pass", "output pass"]
    assert "back to the last window (no combine pass)" in row["launches"][2]
    monkeypatch.setattr(launch, "HOPPER_SCAN_WINDOWS", False)
    row = _h200(GdnShape(1, 65536, 2, 8))
    assert [line.split(":")[0] for line in row["launches"]] == [
        "prepare pass", "segment-state pass", "combine pass (the scan over segments)", "output pass"]


def test_report_on_a_host_without_a_gpu_names_the_torch_path() -> None:
    with platform.use(platform.Platform(backend="cpu", arch=None, device_name=None, warp_size=1,
                                        runtime_version=None)):
        row = plan_report.report(GdnShape(1, 4096, 2, 8))
    assert row["path"] == "torch" and "torch" in plan_report.render(row)


@pytest.mark.parametrize(("text", "packed", "message"), [
    ("1,32768,2", False, "N,T,H,HV or N,T,H,HV,K,V"), ("1,32768,2,x", False, "positive integers"),
    ("0,32768,2,8", False, "positive integers"), ("1,32768,3,8", False, "multiple of H"),
    ("1,32768,2,8,512,128", False, "at most 256"), ("4,3,2,8", True, "at least N")],
    ids=["three-numbers", "not-a-number", "zero", "gva", "wide-k", "packed-too-few-tokens"])
def test_gdn_shape_rejects_what_the_op_would(text: str, packed: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GdnShape.parse(text, packed)


def test_info_gdn_says_fp32_inputs_wider_than_128_run_torch(gluon_release: None,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--gdn", "1,4096,2,8,256,128", "--dtype", "fp32", "--target", "cuda:90", "--sms", "132",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["path"] == "torch" and "fp32 inputs with K = 256" in row["reason"] and "launches" not in row
    assert main(["info", "--gdn", "1,4096,2,8,256,128", "--target", "cuda:90", "--sms", "132", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["path"] == "triton" and row["launches"]


def test_info_gdn_prints_the_plan_for_a_target(gluon_release: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--gdn", "1,32768,4,16", "--target", "cuda:90", "--sms", "132", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["segments"] == 5 and "beside the prepare pass" in row["plan"]
    assert main(["info", "--gdn", "1,32768,2,8", "--target", "hip:gfx942", "--sms", "304"]) == 0
    out = capsys.readouterr().out
    assert "rocm gfx942" in out and "combine pass" in out  # no lead form off sm_90
    # An A100 (the per-arch launch tables): 32-column tiles at 8 warps, where the default's spill in their loop.
    assert main(["info", "--gdn", "1,32768,2,8", "--target", "cuda:80", "--sms", "108"]) == 0
    out = capsys.readouterr().out
    assert "32-column V tiles" in out and "output pass: grid (4, 3, 8), 8 warps, 3 stages" in out
    assert "launches: sm_80's entries in launch.ARCH_*" in out
    assert main(["info", "--gdn", "1,32768,2,8", "--target", "hip:gfx942", "--sms", "304"]) == 0
    assert "launches:" not in capsys.readouterr().out  # the default launches there
    # An H200 and an H100 by their DRAM: the prepare pass's inverse beside the output pass follows it.
    for gbps, form in (("4814", "per-warp levels beside the output pass: DRAM 4814 GB/s, at least 4000"),
                       ("3352", "whole levels beside the output pass: DRAM 3352 GB/s, under 4000")):
        assert main(["info", "--gdn", "1,32768,32,32", "--target", "cuda:90", "--sms", "132", "--dram-gbps", gbps]) == 0
        out = capsys.readouterr().out
        assert form in out and ("inside each warp" in out) == (gbps == "4814")


@pytest.mark.parametrize("argv", [
    ["--target", "cuda:90"], ["--sms", "132"], ["--target", "cuda:xx", "--sms", "132"],
    ["--target", "cuda:90", "--sms", "0"], ["--dram-gbps", "4800"],
    ["--target", "cuda:90", "--sms", "132", "--dram-gbps", "0"],
    ["--target", "cuda:90", "--sms", "132", "--dram-gbps", "nan"]],
    ids=["target-alone", "sms-alone", "bad-target", "no-sms", "dram-without-target", "no-dram", "nan-dram"])
def test_info_gdn_rejects_bad_arguments_by_name(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["info", "--gdn", "1,4096,2,8", *argv])
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("polykernels info: error: --") and any(
        name in error for name in ("--target", "--sms", "--dram-gbps"))


def test_info_gdn_without_a_gpu_or_target_asks_for_one(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # A GPU platform but no device to read the SM count from: the error says what to give.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with platform.use(platform.for_triton_target("cuda:90")), pytest.raises(ValueError, match="--sms"):
        plan_report.report(GdnShape(1, 4096, 2, 8))
