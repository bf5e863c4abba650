"""Spill loads and stores inside loops of a compiled kernel, read from its code on a CPU: NVIDIA SASS
(``cuobjdump -sass``) and AMD GCN assembly (Triton's ``amdgcn``).

A spill inside a loop is paid every iteration: the first form of the register-state sequential pass
reloaded one address per chunk and lost 40% to it on the H200 (BENCHMARKS.md, "thirteenth set");
spills before or after the loop cost once. Both vendors' code is read into one form (``Instruction``)
and the loops are found the same way: natural loops of the control-flow graph, a branch back to a
block that every path to the branch goes through, and the blocks that reach the branch from it. Not
every backward branch: sm_100 code waits on an mbarrier in a stub at the function's end, entered by a
forward branch and left by a branch back to where it was entered (AMD code has such out-of-line
blocks too); the code between such a stub's target and its branch is not repeated.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import NamedTuple


class Instruction(NamedTuple):
    address: int
    spill: bool  # a spill load or store: LDL/STL in SASS, scratch_load/scratch_store in AMD code
    target: int | None = None  # the address a branch goes to
    callee: int | None = None  # the address a relative call goes to
    exits: bool = False  # EXIT, RET, s_endpgm, s_setpc: control goes nowhere in this function after it
    falls_through: bool = True  # control may go on to the next instruction


def sass_loop_spills(sass: str) -> int:
    """``LDL``/``STL`` inside loops of ``cuobjdump -sass`` output."""
    return loop_spills(sass_instructions(sass))


def amdgcn_loop_spills(assembly: str) -> int:
    """``scratch_load``/``scratch_store`` inside loops of the first function of AMD GCN assembly."""
    return loop_spills(amdgcn_instructions(assembly))


# A SASS line: /*address*/ [predicate] OPCODE operands ; and a branch's target address.
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)")
_SASS_TARGET = re.compile(r"\b(0x[0-9a-f]+)")
# A predicate among a branch's operands (``BRA.U !UP0, 0x44b0``): the branch is taken on it alone.
_OPERAND_PREDICATE = re.compile(r"\s*!?U?P[0-7T]\s*,")


def sass_instructions(sass: str) -> list[Instruction]:
    found = []
    for line in sass.splitlines():
        match = _SASS_LINE.search(line)
        if not match:
            continue
        predicated, opcode, operands = bool(match[2]), match[3], match[4]
        base = opcode.split(".", maxsplit=1)[0]
        address = _SASS_TARGET.search(operands)
        target = int(address[1], 16) if address and base == "BRA" else None
        callee = int(address[1], 16) if address and opcode.startswith("CALL.REL") else None
        exits = base in ("EXIT", "RET")
        conditional = predicated or (target is not None and _OPERAND_PREDICATE.match(operands) is not None)
        found.append(Instruction(address=int(match[1], 16), spill=base in ("LDL", "STL"), target=target,
                                 callee=callee, exits=exits,
                                 falls_through=conditional or (target is None and not exits)))
    return found


# AMD GCN assembly as LLVM prints it: a label at the start of a line, an instruction indented by a tab;
# directives (``.loc``, ``.p2align``) and comments (``;``) are neither.
_AMDGCN_LABEL = re.compile(r"^([.\w$]+):")
_AMDGCN_INSTRUCTION = re.compile(r"^\s+([a-z][a-z0-9_]*)\b([^;]*)")


def amdgcn_instructions(assembly: str) -> list[Instruction]:
    """The instructions of the first function (from its label to its ``.Lfunc_end``), numbered in order:
    ``s_branch`` always goes to its label, an ``s_cbranch_*`` may fall through."""
    lines = assembly.splitlines()
    start = next((index for index, line in enumerate(lines)
                  if (label := _AMDGCN_LABEL.match(line)) and not label[1].startswith(".")), len(lines))
    labels: dict[str, int] = {}
    parsed: list[tuple[str, str]] = []
    for line in lines[start + 1:]:
        label = _AMDGCN_LABEL.match(line)
        if label:
            if label[1].startswith(".Lfunc_end"):
                break
            labels[label[1]] = len(parsed)
            continue
        instruction = _AMDGCN_INSTRUCTION.match(line)
        if instruction:
            parsed.append((instruction[1], instruction[2].strip()))
    found = []
    for address, (opcode, operands) in enumerate(parsed):
        branch = opcode == "s_branch" or opcode.startswith("s_cbranch_")
        exits = opcode == "s_endpgm" or opcode.startswith("s_setpc_")
        found.append(Instruction(address=address, spill=opcode.startswith(("scratch_load", "scratch_store")),
                                 target=labels.get(operands.split(",")[0].strip()) if branch else None,
                                 exits=exits, falls_through=opcode != "s_branch" and not exits))
    return found


def loop_spills(instructions: Sequence[Instruction]) -> int:
    """The spill instructions that sit in a block of a natural loop."""
    successors = _control_flow(instructions)
    predecessors: dict[int, list[int]] = {}
    for block, targets in successors.items():
        for target in targets:
            predecessors.setdefault(target, []).append(block)
    entry = instructions[0].address if instructions else 0
    loops: set[int] = set()
    for block, targets in successors.items():
        for header in targets:
            if header <= block:
                loops |= _natural_loop(predecessors, entry, header, block)
    starts = sorted(successors)
    return sum(1 for instruction in instructions if instruction.spill
               and starts[bisect.bisect_right(starts, instruction.address) - 1] in loops)


def _control_flow(instructions: Sequence[Instruction]) -> dict[int, list[int]]:
    """Basic blocks reachable from the entry (by first address) -> their successors' first addresses: branch
    targets, the next block where control can fall through, and the callees of relative calls."""
    if not instructions:
        return {}
    leaders = {instructions[0].address}
    for index, instruction in enumerate(instructions[:-1]):
        leaders.update(start for start in (instruction.target, instruction.callee) if start is not None)
        if instruction.target is not None or instruction.exits:
            leaders.add(instructions[index + 1].address)
    successors: dict[int, list[int]] = {}
    block = instructions[0].address
    for index, instruction in enumerate(instructions):
        if instruction.address in leaders:
            block = instruction.address
            successors[block] = []
        following = instructions[index + 1].address if index + 1 < len(instructions) else None
        if instruction.callee is not None:  # the callee's blocks are reached from here (its RET ends them)
            successors[block].append(instruction.callee)
        if not (instruction.target is not None or instruction.exits or following in leaders):
            continue
        if instruction.target is not None:
            successors[block].append(instruction.target)
        if instruction.falls_through and following is not None:
            successors[block].append(following)
    reached, stack = set(), [instructions[0].address]
    while stack:
        block = stack.pop()
        if block in reached or block not in successors:
            continue
        reached.add(block)
        stack.extend(successors[block])
    return {block: [s for s in targets if s in reached] for block, targets in successors.items() if block in reached}


def _natural_loop(predecessors: dict[int, list[int]], entry: int, header: int, latch: int) -> set[int]:
    """The blocks of the loop closed by the edge latch -> header: those that reach the latch without
    passing the header, and the header. Empty where a path from the entry reaches the latch without
    passing the header (the edge closes no loop)."""
    body, stack = {header}, [latch]
    while stack:
        block = stack.pop()
        if block in body:
            continue
        if block == entry:
            return set()
        body.add(block)
        stack.extend(predecessors.get(block, []))
    return body
