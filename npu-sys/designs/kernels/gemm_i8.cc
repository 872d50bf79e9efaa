// xdna-vl GEMM kernel, int8 x int8 -> int32, exact: C += A x B^T for one core tile
// (layouts in gemm_common.h). Called once per K tile, in ascending K order, after zero.
#include "gemm_common.h"

static inline void matmul_i8(const int8 *__restrict a, const int8 *__restrict b,
                             int32 *__restrict c) {
  constexpr unsigned mb = DIM_M / MMUL_R, kb = DIM_K / MMUL_S, nb = DIM_N / MMUL_T;
  for (unsigned i = 0; i < mb; ++i) {
    for (unsigned j = 0; j < nb; ++j) {
      int32 *__restrict pc = c + (i * nb + j) * MMUL_I8::size_C;
      const int8 *__restrict pa = a + i * kb * MMUL_I8::size_A;
      const int8 *__restrict pb = b + j * kb * MMUL_I8::size_B;
      // Integer accumulation is exact; the order does not matter.
      MMUL_I8 acc(aie::load_v<MMUL_I8::size_C>(pc));
      for (unsigned x = 0; x < kb; ++x) {
        aie::vector<int8, MMUL_I8::size_A> va = aie::load_v<MMUL_I8::size_A>(pa);
        aie::vector<int8, MMUL_I8::size_B> vb = aie::load_v<MMUL_I8::size_B>(pb);
        acc.mac(va, b_operand(vb));
        pa += MMUL_I8::size_A;
        pb += MMUL_I8::size_B;
      }
      aie::store_v(pc, acc.template to_vector<int32>());
    }
  }
}

extern "C" {

void xdna_vl_zero_i32(int32 *c) { zero_tile<int32>(c); }

void xdna_vl_matmul_i8(int8 *a, int8 *b, int32 *c) { matmul_i8(a, b, c); }

} // extern "C"
