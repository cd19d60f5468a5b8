"""tools/cuda_check.py's static reading of a kernel's machine code (--sass), on hand-written SASS: which loop it calls
the main loop and what it counts there. Compiling needs NVIDIA's toolchain wheels (minutes); these do not."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import cuda_check  # noqa: E402


def sass(lines: list[str]) -> list[tuple[int, str]]:
    """[(address, instruction)], 16 bytes apart, as sass_functions gives them."""
    return [(16 * i, text) for i, text in enumerate(lines)]


# a kernel's shape: a prologue, a tile loop (an inner staging loop, two mma, a barrier), an exit, and a cold block
# placed after the exit that branches back into the loop (as ptxas places a rarely taken path)
KERNEL = [
    "MOV R1, c[0x0][0x28]",  # 0x00
    "S2R R0, SR_TID.X",  # 0x10
    "LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64]",  # 0x20 tile loop head; staging loop head
    "IADD3 R4, R4, 0x10, RZ",  # 0x30
    "@P0 BRA 0x20",  # 0x40 staging loop latch
    "LDS R8, [R2]",  # 0x50
    "@P1 BRA 0xd0",  # 0x60 to the cold block
    "IMMA.16816.S8.S8 R12, R8, R10, R12",  # 0x70
    "HMMA.16816.F32 R16, R8, R10, R16",  # 0x80
    "BAR.SYNC.DEFER_BLOCKING 0x0",  # 0x90
    "@P2 BRA 0x20",  # 0xa0 tile loop latch
    "STG.E [R6.64], R16",  # 0xb0
    "EXIT",  # 0xc0
    "MUFU.EX2 R9, R9",  # 0xd0 cold block
    "BRA 0x20",  # 0xe0 back into the loop: looks like a loop from 0x20 to 0xe0
]


def test_the_main_loop_is_the_innermost_loop_holding_every_mma():
    out = cuda_check.sass_summary(sass(KERNEL))
    # the tile loop 0x20..0xa0 (9 instructions), not the cold block's jump back (0x20..0xe0, 13)
    assert out.startswith("15 instructions; main loop 9, 6 outside its inner loops"), out
    assert "mma 2" in out and "barrier 1" in out and "lds 1" in out, out
    assert "stg" not in out, out
    assert out.endswith("1 loops inside: 3"), out


def test_without_mma_the_largest_loop():
    no_mma = [t.replace("IMMA.16816.S8.S8", "IDP.4A.S8.S8").replace("HMMA.16816.F32", "FFMA") for t in KERNEL]
    out = cuda_check.sass_summary(sass(no_mma))
    assert out.startswith("15 instructions; main loop 13,"), out
