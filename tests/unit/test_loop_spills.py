"""Spills inside loops, read from NVIDIA SASS and AMD GCN assembly (polykernels.loop_spills). The real
compiles that feed it are tested in test_kernel_registry.py."""

from __future__ import annotations

from polykernels.loop_spills import amdgcn_loop_spills, sass_loop_spills


def test_sass_loop_spills_are_counted_between_a_backward_branch_and_its_target() -> None:
    sass = """
        /*0000*/                   LDL R1, [R1+0x4] ;
        /*0010*/                   FADD R2, R2, R3 ;
        /*0020*/                   STL [R1], R2 ;
        /*0030*/                   LDL.LU R4, [R1+0x8] ;
        /*0040*/              @P0   BRA 0x10 ;
        /*0050*/                   STL [R1+0xc], R4 ;
        /*0060*/                   BRA 0x70 ;
        /*0070*/                   EXIT ;
    """
    assert sass_loop_spills(sass) == 2  # the STL and LDL.LU between 0x10 and the branch at 0x40
    assert sass_loop_spills("") == 0


def test_an_mbarrier_wait_stub_at_the_end_is_no_loop() -> None:
    # sm_100 code: a failed wait branches forward to a stub that waits again and branches back to where
    # it left. The branch back is backward, but the spills between its target and it run once.
    sass = """
        /*0000*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR9], RZ ;
        /*0010*/              @!P1 BRA 0x80 ;
        /*0020*/                   STL [R1], R2 ;
        /*0030*/                   LDL R4, [R1+0x8] ;
        /*0040*/                   BRA.U !UP0, 0x30 ;
        /*0050*/                   STL [R1+0xc], R4 ;
        /*0060*/                   EXIT ;
        /*0070*/                   BRA 0x70 ;
        /*0080*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR9], RZ ;
        /*0090*/              @!P1 BRA 0x80 ;
        /*00a0*/                   BRA 0x20 ;
    """
    assert sass_loop_spills(sass) == 1  # the LDL of the loop 0x30-0x40 (a uniform predicate's) only


# LLVM's printing of a kernel: a prologue, a loop whose body leaves for a block at the function's end and
# comes back, a stub entered once and left by a branch back, and the metadata after the function (whose
# YAML may hold anything, instructions' names too).
_AMDGCN = """\
	.amdgcn_target "amdgcn-amd-amdhsa--gfx942"
	.text
	.globl	kernel                          ; -- Begin function kernel
	.p2align	8
	.type	kernel,@function
kernel:                                 ; @kernel
.Lfunc_begin0:
; %bb.0:
	s_load_dwordx2 s[2:3], s[0:1], 0x0
	scratch_store_dword off, v1, off        ; 4-byte Folded Spill
	s_cbranch_execz .LBB0_5
.LBB0_1:
	s_waitcnt lgkmcnt(0)
.LBB0_2:                                ; =>This Inner Loop Header: Depth=1
	.loc	1 12 7                          ; kernel.py:12:7
	scratch_load_dword v2, off, off offset:4 ; 4-byte Folded Reload
	v_add_f32_e32 v1, v1, v2
	s_cbranch_vccnz .LBB0_4
.LBB0_3:                                ;   in Loop: Header=BB0_2 Depth=1
	scratch_store_dword off, v1, off offset:8 ; 4-byte Folded Spill
	s_add_i32 s4, s4, -1
	s_cmp_lg_u32 s4, 0
	s_cbranch_scc1 .LBB0_2
; %bb.6:
	scratch_load_dword v3, off, off offset:8 ; 4-byte Folded Reload
	global_store_dword v0, v3, s[2:3]
	s_endpgm
.LBB0_4:                                ;   in Loop: Header=BB0_2 Depth=1
	scratch_load_dwordx2 v[4:5], off, off offset:16 ; 8-byte Folded Reload
	s_branch .LBB0_3
.LBB0_5:
	scratch_load_dword v6, off, off offset:24 ; 4-byte Folded Reload
	s_branch .LBB0_1
.Lfunc_end0:
	.size	kernel, .Lfunc_end0-kernel
	.section	.AMDGPU.csdata,"",@progbits
	.amdgpu_metadata
---
amdhsa.kernels:
  - .name:           scratch_load_dword
    .symbol:         kernel.kd
	scratch_load_dword v2, off, off
.LBB9_9:
	s_branch .LBB9_9
"""


def test_amdgcn_loop_spills_are_the_loops_scratch_loads_and_stores() -> None:
    # In the loop: the header's reload, the latch block's spill and the out-of-line block it branches to and
    # back from. Not: the prologue's spill, the reload after the loop, the stub entered once from the
    # prologue (a backward branch that closes no loop), nor anything after .Lfunc_end0.
    assert amdgcn_loop_spills(_AMDGCN) == 3


def test_amdgcn_code_without_a_loop_or_without_a_function_has_no_loop_spills() -> None:
    straight = _AMDGCN.replace("s_cbranch_scc1 .LBB0_2", "s_nop 0")
    assert amdgcn_loop_spills(straight) == 0
    assert amdgcn_loop_spills("") == 0
    assert amdgcn_loop_spills("\t.text\n\tscratch_load_dword v2, off, off\n") == 0
