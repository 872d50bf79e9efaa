#!/usr/bin/env python3
# xdna-vl: GEMM designs for the Ryzen AI NPU, written with mlir-aie's IRON API.
#
# One design computes, for one geometry (kind, M tile, K, N), on the whole AIE array:
#   i8: C int32 [M][N] = A int8 [M][K] x B int8 [N][K]^T, exact;
#   q4: C f32 [M][N], per group g = 0, 1, ... of 32 along K in ascending order,
#       acc += (f32)(int dot of A and the 4-bit codes over g) * (f32)scale[n][g], codes stored
#       offset binary (nibble = code + 8);
# The host buffers are exactly those of npu-sys/include/xdna_vl_runtime.h (A group 3, B group 4
# -- for q4 the codes [N][K/2] followed by the bf16 scales [N][K/32] -- and C group 5).
#
# Everything numeric -- the tiling, which shims and memory tiles carry what, every host transfer
# and every memory-tile reordering -- comes from the parameters `npu-designs build` writes
# (npu-sys/src/design_params.rs, dma_plan.rs), where it is tested against the ABI's layouts.
# This file checks those parameters against the buffers it declares and emits the MLIR module
# (on stdout) that aiecc.py compiles. Its structure follows mlir-aie's whole-array
# matrix-multiplication example (A split over rows and broadcast along them, B broadcast down
# columns, C joined per column), with the q4 scales as a third input.
#
#   gemm_design.py --params PARAMS.json             # MLIR on stdout (needs mlir-aie's Python)
#   gemm_design.py --params PARAMS.json --dry-run   # check only; needs no mlir-aie
#
# Status: unverified on hardware -- written without an NPU or mlir-aie at hand; run
# `npu-designs verify` on a Ryzen AI machine before trusting a design.

import argparse
import json
import sys

FORMAT = "xdna-vl-design-params"
VERSION = 1
DEVICE_COLUMNS = {"npu1": 4, "npu2": 8}


class DesignError(Exception):
    pass


def require(condition, message):
    if not condition:
        raise DesignError(message)


def load(path):
    try:
        with open(path) as f:
            p = json.load(f)
    except (OSError, ValueError) as e:
        raise DesignError(f"{path}: {e}")
    require(p.get("format") == FORMAT, f"{path}: format is {p.get('format')!r}, expected {FORMAT!r}")
    require(p.get("version") == VERSION, f"{path}: version is {p.get('version')!r}, expected {VERSION}")
    return p


def buffer_sizes(p):
    """Bytes of each buffer this design declares, per core and per memory tile (by column)."""
    q4 = p["kind"] == "q4"
    m, kt, nt, rows, depth = p["m"], p["k_tile"], p["n_tile"], p["rows"], p["fifo_depth"]
    dma = p["dma"]
    b_l1 = dma["b_object"]
    s_l1 = dma["s_object"] // 2 if q4 else 0
    core = depth * (m * kt + b_l1 + s_l1 + m * nt * 4)
    mem = []
    for col in range(p["columns"]):
        used = dma["b_object"] + dma["c_object"]
        if col in p["a_shim_columns"]:
            used += dma["a_object"]
        if col in p["scale_shim_columns"]:
            used += dma["s_object"]
        mem.append(depth * used)
    return core, mem


def tap_len(tap):
    n = 1
    for s in tap["sizes"]:
        n *= s
    return n


def check(p):
    """Refuses parameters this file cannot build as written, naming the field."""
    name = p["name"]
    kind, device = p["kind"], p["device"]
    require(kind in ("i8", "q4"), f"{name}: kind {kind!r}")
    require(device in DEVICE_COLUMNS, f"{name}: device {device!r}")
    M, K, N = p["m_tile"], p["k"], p["n"]
    m, kt, nt = p["m"], p["k_tile"], p["n_tile"]
    rows, cols = p["rows"], p["columns"]
    r, s, t = p["mmul"]
    require(cols <= DEVICE_COLUMNS[device], f"{name}: {cols} columns on {device}")
    require(rows <= 4, f"{name}: {rows} rows")
    require(M % (rows * m) == 0, f"{name}: M {M} is not whole blocks of rows x m = {rows * m}")
    require(K % kt == 0, f"{name}: K {K} is not whole tiles of {kt}")
    require(N % (cols * nt) == 0, f"{name}: N {N} is not whole tiles of columns x n = {cols * nt}")
    require(m % r == 0 and kt % s == 0 and nt % t == 0, f"{name}: tile {m}x{kt}x{nt} vs intrinsic {r}x{s}x{t}")
    if kind == "q4":
        require(kt % (2 * p["q4_group"]) == 0, f"{name}: q4 K tile {kt} is not whole group pairs")
        require(len(p["scale_shim_columns"]) * 2 == cols, f"{name}: scale shims {p['scale_shim_columns']}")
    else:
        require(not p["scale_shim_columns"], f"{name}: an i8 design has no scales")
    require(len(p["a_shim_columns"]) * p["a_rows_per_shim"] == rows, f"{name}: A shims {p['a_shim_columns']}")
    core, mem = buffer_sizes(p)
    require(core == p["core_bytes"], f"{name}: the cores' buffers are {core} bytes here, {p['core_bytes']} in the tiling")
    require(core <= p["core_budget"], f"{name}: core buffers {core} > budget {p['core_budget']}")
    require(max(mem) == p["mem_tile_bytes"], f"{name}: memory tiles {max(mem)} bytes here, {p['mem_tile_bytes']} in the tiling")
    require(max(mem) <= p["mem_tile_budget"], f"{name}: memory tile {max(mem)} > budget {p['mem_tile_budget']}")
    dma, host = p["dma"], p["host"]
    require(dma["m_blocks"] * dma["n_tiles"] == p["tiles_per_core"], f"{name}: tiles per core")
    objects = {"A": dma["a_object"], "B": dma["b_object"], "S": dma["s_object"]}
    lengths = {"A": host["a_bytes"], "B": host["b_bytes"], "C": host["c_bytes"] // 4}
    for tr in dma["transfers"]:
        fifo, tap = tr["fifo"], tr["tap"]
        if fifo[0] in objects:
            require(tap_len(tap) == p["k_tiles"] * objects[fifo[0]], f"{name}: {fifo} moves {tap_len(tap)} elements per tile")
        else:
            require(tap_len(tap) * 4 == dma["c_object"], f"{name}: {fifo} drains {tap_len(tap)} elements per tile")
        last = (
            tap["offset"]
            + (dma["m_blocks"] - 1) * tr["mb_stride"]
            + (dma["n_tiles"] - 1) * tr["ni_stride"]
            + sum((size - 1) * stride for size, stride in zip(tap["sizes"], tap["strides"]))
        )
        require(last < lengths[tr["tensor"]], f"{name}: {fifo} reaches element {last} of {lengths[tr['tensor']]}")


def dims(pairs):
    return [tuple(d) for d in pairs]


def device_type(p):
    import aie.iron.device as devices

    if p["device"] == "npu2":
        return devices.NPU2()
    # npu1 partitions: NPU1Col1/2/4 in mlir-aie's IRON; newer releases also name the whole
    # 4-column array NPU1.
    wanted = {1: "NPU1Col1", 2: "NPU1Col2", 4: "NPU1Col4"}.get(p["columns"])
    if wanted and hasattr(devices, wanted):
        return getattr(devices, wanted)()
    if p["columns"] == 4 and hasattr(devices, "NPU1"):
        return devices.NPU1()
    raise DesignError(f"{p['name']}: this mlir-aie has no npu1 device of {p['columns']} columns")


def loop(count):
    """A core loop; mlir-aie's examples avoid range_(1) (issue #1547)."""
    from aie.iron.controlflow import range_

    return range_(count) if count > 1 else range(1)


def emit(p):
    import numpy as np
    from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
    from aie.iron.placers import SequentialPlacer
    from aie.iron.device import Tile
    from aie.helpers.taplib import TensorAccessPattern

    q4 = p["kind"] == "q4"
    dma, host, kernel = p["dma"], p["host"], p["kernel"]
    m, kt, nt = p["m"], p["k_tile"], p["n_tile"]
    rows, cols, depth = p["rows"], p["columns"], p["fifo_depth"]
    rps = p["a_rows_per_shim"]
    c_dtype = np.float32 if q4 else np.int32
    b_dtype = np.uint8 if q4 else np.int8

    def vec(n, dtype):
        return np.ndarray[(n,), np.dtype[dtype]]

    A_ty = vec(host["a_bytes"], np.int8)
    B_ty = vec(host["b_bytes"], b_dtype)
    C_ty = vec(host["c_bytes"] // 4, c_dtype)
    a_l2, a_l1 = vec(dma["a_object"], np.int8), vec(m * kt, np.int8)
    b_l2 = b_l1 = vec(dma["b_object"], b_dtype)
    c_l1, c_l2 = vec(m * nt, c_dtype), vec(rows * m * nt, c_dtype)

    zero = Kernel(kernel["zero"], kernel["object"], [c_l1])
    if q4:
        s_l2, s_l1 = vec(dma["s_object"], np.uint8), vec(dma["s_object"] // 2, np.uint8)
        matmul = Kernel(kernel["matmul"], kernel["object"], [a_l1, b_l1, s_l1, c_l1])
    else:
        matmul = Kernel(kernel["matmul"], kernel["object"], [a_l1, b_l1, c_l1])

    fills = {}  # fifo name -> the object FIFO the runtime fills or drains
    # A: each A shim's memory tile splits its rows of cores' blocks; each row is broadcast along
    # the row of cores, reordered into r x s blocks.
    a_rows = {}
    for i, col in enumerate(p["a_shim_columns"]):
        fifo = ObjectFifo(a_l2, name=f"A{i}", default_depth=depth)
        fills[f"A{i}"] = fifo
        first = i * rps
        parts = fifo.cons().split(
            [m * kt * j for j in range(rps)],
            obj_types=[a_l1] * rps,
            names=[f"A{i}_row{first + j}" for j in range(rps)],
            dims_to_stream=[dims(dma["a_to_core"])] * rps,
            placement=Tile(col, 1),
        )
        for j in range(rps):
            a_rows[first + j] = parts[j]
    # B (int8 or q4 codes): each column's own, broadcast down the column in t x s blocks.
    b_cols = {}
    for col in range(cols):
        fifo = ObjectFifo(b_l2, name=f"B{col}", default_depth=depth)
        fills[f"B{col}"] = fifo
        b_cols[col] = fifo.cons().forward(
            obj_type=b_l1,
            name=f"B{col}_cores",
            dims_to_stream=dims(dma["b_to_core"]),
            placement=Tile(col, 1),
        )
    # q4 scales: one shim per pair of columns, split in its memory tile.
    s_cols = {}
    for j, col in enumerate(p["scale_shim_columns"]):
        fifo = ObjectFifo(s_l2, name=f"S{j}", default_depth=depth)
        fills[f"S{j}"] = fifo
        parts = fifo.cons().split(
            [0, dma["s_object"] // 2],
            obj_types=[s_l1, s_l1],
            names=[f"S{j}_col{2 * j}", f"S{j}_col{2 * j + 1}"],
            placement=Tile(col, 1),
        )
        s_cols[2 * j], s_cols[2 * j + 1] = parts
    # C: joined per column from its rows of cores, back to row-major on the way to the host.
    c_parts = {}
    for col in range(cols):
        fifo = ObjectFifo(c_l2, name=f"C{col}", default_depth=depth, dims_to_stream=dims(dma["c_to_host"]))
        fills[f"C{col}"] = fifo
        parts = fifo.prod().join(
            [m * nt * row for row in range(rows)],
            obj_types=[c_l1] * rows,
            names=[f"C{col}_row{row}" for row in range(rows)],
            depths=[depth] * rows,
            placement=Tile(col, 1),
        )
        for row in range(rows):
            c_parts[(row, col)] = parts[row]

    tiles, k_tiles = p["tiles_per_core"], p["k_tiles"]

    # Each output tile: zeroed, then the K tiles in ascending order (the q4 group order).
    def core_i8(a, b, c, zero_c, mm):
        for _ in loop(tiles):
            out = c.acquire(1)
            zero_c(out)
            for _ in loop(k_tiles):
                ea, eb = a.acquire(1), b.acquire(1)
                mm(ea, eb, out)
                a.release(1)
                b.release(1)
            c.release(1)

    def core_q4(a, b, s, c, zero_c, mm):
        for _ in loop(tiles):
            out = c.acquire(1)
            zero_c(out)
            for _ in loop(k_tiles):
                ea, eb, es = a.acquire(1), b.acquire(1), s.acquire(1)
                mm(ea, eb, es, out)
                a.release(1)
                b.release(1)
                s.release(1)
            c.release(1)

    workers = []
    for row in range(rows):
        for col in range(cols):
            inputs = [a_rows[row].cons(), b_cols[col].cons()]
            if q4:
                inputs.append(s_cols[col].cons())
            args = inputs + [c_parts[(row, col)].prod(), zero, matmul]
            workers.append(Worker(core_q4 if q4 else core_i8, args, placement=Tile(col, row + 2)))

    lengths = {"A": host["a_bytes"], "B": host["b_bytes"], "C": host["c_bytes"] // 4}
    rt = Runtime()
    with rt.sequence(A_ty, B_ty, C_ty) as (A, B, C):
        tensors = {"A": A, "B": B, "C": C}
        rt.start(*workers)
        # One task group per (block of rows, output tile); two in flight, so that a group's
        # transfers overlap the previous group's compute while the shims' buffer descriptors
        # are reused.
        previous = None
        for mb in range(dma["m_blocks"]):
            for ni in range(dma["n_tiles"]):
                group = rt.task_group()
                for tr in dma["transfers"]:
                    tap = TensorAccessPattern(
                        (lengths[tr["tensor"]],),
                        tr["tap"]["offset"] + mb * tr["mb_stride"] + ni * tr["ni_stride"],
                        tr["tap"]["sizes"],
                        tr["tap"]["strides"],
                    )
                    shim = Tile(tr["shim_column"], 0)
                    fifo = fills[tr["fifo"]]
                    if tr["tensor"] == "C":
                        rt.drain(fifo.cons(), tensors["C"], tap=tap, wait=True, task_group=group, placement=shim)
                    else:
                        rt.fill(fifo.prod(), tensors[tr["tensor"]], tap=tap, task_group=group, placement=shim)
                if previous is not None:
                    rt.finish_task_group(previous)
                previous = group
        rt.finish_task_group(previous)

    return Program(device_type(p), rt).resolve_program(SequentialPlacer())


def main(argv):
    parser = argparse.ArgumentParser(description="xdna-vl GEMM design (IRON) from npu-designs parameters")
    parser.add_argument("--params", required=True, help="the design's parameters (JSON from npu-designs build)")
    parser.add_argument("--dry-run", action="store_true", help="check the parameters only (no mlir-aie needed)")
    args = parser.parse_args(argv)
    try:
        p = load(args.params)
        check(p)
        if args.dry_run:
            core, mem = buffer_sizes(p)
            print(f"{p['name']} on {p['device']}: {p['columns']} columns x {p['rows']} rows, core tile "
                  f"{p['m']}x{p['k_tile']}x{p['n_tile']}, core {core} bytes, memory tiles {mem}, "
                  f"{len(p['dma']['transfers'])} transfers x {p['tiles_per_core']} task groups: ok")
            return 0
        print(emit(p))
        return 0
    except DesignError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
