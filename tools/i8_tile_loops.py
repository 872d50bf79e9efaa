#!/usr/bin/env python3
"""Inner loops of the AVX2 i8 GEMM tile (vpmaddwd on i16 codes) against the peak mix, in L1.

Why: `bench` sets the i8 GEMM against the register-only `vpmaddwd`+`vpaddd` mix. This shows how
much of that the tile's own loop (its weight loads and broadcasts included, every operand in L1)
reaches on this CPU, so a GEMM's shortfall can be split into "the loop form" and "everything
around it" (memory, threads, per-call work).

Each variant is one thread of standalone assembly (written to a temporary directory, built with
gcc), run for 128 code pairs per call (one K chunk of `gemm/src/kernels/x86/i8_pairs.rs`), timed
between two runs of the peak mix; the printed figure is the median over 41 alternations of
(variant multiply-adds per second) / (peak mix multiply-adds per second), with quartiles.

Variants (rows x panels of 8 weight rows):
  kernel_3x3    the kernel's tile: 3 weight vectors loaded, 3 broadcasts, 9 vpmaddwd + 9 vpaddd
  4x3_folded1   4 rows x 3 panels, the third panel's weights as a memory operand (16 registers)
  4x3_prebcast  4 x 3 with activations stored pre-broadcast (32 bytes per pair), madd memory operand
  3x3_noloads   the kernel's tile with every load removed (the loop form alone)

Usage: python3 tools/i8_tile_loops.py [--lock /work/notes/bench.lock]   (x86-64, AVX2, gcc)
"""

import argparse
import os
import subprocess
import sys
import tempfile

W_STRIDE = 4096  # bytes between panels' chunks (128 pairs x 32 bytes)
A_STRIDE = 4096  # bytes between activation rows


def zero_all():
    return [f"vpxor ymm{r}, ymm{r}, ymm{r}" for r in range(16)]


def tile(name, rows, panels, wregs, loads=True, prebcast=False):
    """rows x panels accumulators; `wregs` panels' weights in registers, the rest memory operands."""
    acc = {(i, c): i * panels + c for i in range(rows) for c in range(panels)}
    wr = {c: rows * panels + c for c in range(wregs)}
    b = rows * panels + wregs
    t = b + (0 if prebcast else 1)
    assert t <= 15, name
    body = []
    for c in range(wregs):
        if loads:
            body.append(f"vmovdqu ymm{wr[c]}, [rsi+rax*8+{c * W_STRIDE}]")
    for i in range(rows):
        if not prebcast and loads:
            body.append(f"vpbroadcastd ymm{b}, [rdi+rax+{i * A_STRIDE}]")
        for c in range(panels):
            if prebcast:
                src = f"ymmword ptr [rdi+rax*8+{i * A_STRIDE}]"
                body.append(f"vpmaddwd ymm{t}, ymm{wr[c]}, {src}")
            else:
                src = f"ymm{wr[c]}" if c in wr else f"ymmword ptr [rsi+rax*8+{c * W_STRIDE}]"
                body.append(f"vpmaddwd ymm{t}, ymm{b}, {src}")
            body.append(f"vpaddd ymm{acc[(i, c)]}, ymm{acc[(i, c)]}, ymm{t}")
    lines = [f".globl {name}", f"{name}:"] + zero_all() + ["mov rcx, rdx", "xor rax, rax", "1:"]
    lines += body + ["add rax, 4", "dec rcx", "jnz 1b", "vzeroupper", "ret"]
    return "\n".join(lines), rows * panels


def peak():
    lines = [".globl peak", "peak:"] + zero_all() + ["1:"]
    for i in range(12):
        t = 2 + i % 2
        lines += [f"vpmaddwd ymm{t}, ymm0, ymm1", f"vpaddd ymm{4 + i}, ymm{4 + i}, ymm{t}"]
    lines += ["dec rdx", "jnz 1b", "vzeroupper", "ret"]
    return "\n".join(lines)


VARIANTS = [
    ("kernel_3x3", dict(rows=3, panels=3, wregs=3)),
    ("x4x3_folded1", dict(rows=4, panels=3, wregs=2)),
    ("x4x3_prebcast", dict(rows=4, panels=3, wregs=3, prebcast=True)),
    ("x3x3_noloads", dict(rows=3, panels=3, wregs=3, loads=False)),
]

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
void peak(const void*, const void*, long);
%(decls)s
static short A[16 * 4096] __attribute__((aligned(64)));
static short W[8 * 4096] __attribute__((aligned(64)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
typedef void (*fn)(const void*, const void*, long);
int main(void) {
  enum { R = 41, REPS = 2000, N = %(n)d };
  fn f[N] = { %(names)s };
  int madds[N] = { %(madds)s };
  const char* label[N] = { %(labels)s };
  static double ratio[N][R];
  for (int round = 0; round < R; round++)
    for (int v = 0; v < N; v++) {
      double t0 = now(); for (int r = 0; r < REPS; r++) peak(A, W, 128); double tp = now() - t0;
      t0 = now(); for (int r = 0; r < REPS; r++) f[v](A, W, 128); double t = now() - t0;
      t0 = now(); for (int r = 0; r < REPS; r++) peak(A, W, 128); tp = (tp + now() - t0) / 2;
      ratio[v][round] = (madds[v] / t) / (12.0 / tp);
    }
  for (int v = 0; v < N; v++) {
    qsort(ratio[v], R, sizeof(double), cmp);
    printf("%%-14s %%.3f of the vpmaddwd+vpaddd peak mix (quartiles %%.3f-%%.3f)\n", label[v],
           ratio[v][R / 2], ratio[v][R / 4], ratio[v][3 * R / 4]);
  }
  return 0;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lock", help="flock this file around the timed run")
    args = ap.parse_args()
    asm = [".intel_syntax noprefix", ".text", peak()]
    madds = []
    for name, kw in VARIANTS:
        text, m = tile(name, **kw)
        asm.append(text)
        madds.append(m)
    names = [n for n, _ in VARIANTS]
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.S"), "w") as f:
            f.write("\n".join(asm) + '\n.section .note.GNU-stack,"",@progbits\n')
        with open(os.path.join(d, "m.c"), "w") as f:
            f.write(DRIVER % dict(
                decls="\n".join(f"void {n}(const void*, const void*, long);" for n in names),
                n=len(names), names=", ".join(names), madds=", ".join(map(str, madds)),
                labels=", ".join(f'"{n.lstrip("x")}"' for n in names)))
        exe = os.path.join(d, "loops")
        subprocess.run(["gcc", "-O2", "-o", exe, os.path.join(d, "m.c"), os.path.join(d, "k.S")],
                       check=True)
        cmd = [exe] if not args.lock else ["flock", args.lock, exe]
        sys.exit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
