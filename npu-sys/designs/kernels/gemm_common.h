// xdna-vl GEMM kernels for one AIE core: shared definitions.
//
// A core tile is DIM_M x DIM_K x DIM_N (passed with -D by `npu-designs build`, from the Rust
// tiling), computed with the int8 matmul intrinsic MMUL_R x MMUL_S x MMUL_T (4x8x8 on AIE2 /
// npu1, 8x8x8 on AIE2P / npu2). The memory tiles deliver the operands already in intrinsic
// blocks (npu-sys/src/dma_plan.rs, where the layouts are simulated against the C ABI):
//   A: (DIM_M/r) x (DIM_K/s) blocks of r x s int8, blocks row-major, each block row-major;
//   B: (DIM_N/t) x (DIM_K/s) blocks of t x s -- B is a linear weight [n][k], so each block holds
//      t rows of n with s values of k: int8, or for q4 4-bit codes stored offset binary (code + 8),
//      two per byte, the even element in the low nibble;
//   C: (DIM_M/r) x (DIM_N/t) blocks of r x t, int32 or f32, accumulated across K tiles.
#ifndef XDNA_VL_GEMM_COMMON_H
#define XDNA_VL_GEMM_COMMON_H

#include <stdint.h>

#include <aie_api/aie.hpp>

#ifndef DIM_M
#error "DIM_M, DIM_K, DIM_N, MMUL_R, MMUL_S, MMUL_T are set by npu-designs build"
#endif

static_assert(DIM_M % MMUL_R == 0, "DIM_M must be whole intrinsic rows");
static_assert(DIM_K % MMUL_S == 0, "DIM_K must be whole intrinsic steps");
static_assert(DIM_N % MMUL_T == 0, "DIM_N must be whole intrinsic columns");

using MMUL_I8 = aie::mmul<MMUL_R, MMUL_S, MMUL_T, int8, int8, acc32>;

// One t x s block of B (as [n][k]) turned into the s x t operand the intrinsic multiplies.
template <typename V>
static inline aie::vector<int8, MMUL_I8::size_B> b_operand(V block) {
  return aie::transpose(block, MMUL_T, MMUL_S);
}

template <typename T>
static inline void zero_tile(T *__restrict c) {
  constexpr unsigned lanes = 64 / sizeof(T); // one 512-bit vector
  static_assert((DIM_M * DIM_N) % lanes == 0, "C tile must be whole vectors");
  const aie::vector<T, lanes> zeros = aie::zeros<T, lanes>();
  for (unsigned i = 0; i < DIM_M * DIM_N; i += lanes)
    aie::store_v(c + i, zeros);
}

#endif
