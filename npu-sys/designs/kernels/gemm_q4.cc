// xdna-vl GEMM kernel, int8 x q4 -> f32 for one core tile (layouts in gemm_common.h), in the
// order the C ABI specifies: for each group g of Q4_GROUP values along K, ascending,
//   acc += (f32)(exact integer dot over g) * (f32)scale[n][g].
// Called once per K tile in ascending K order after zero, so the groups of the whole row are
// summed in ascending order. The scales arrive as [DIM_N][DIM_K / Q4_GROUP] bf16.
//
// Why this matches the host bit for bit when the hardware rounds as IEEE f32 does: |dot| <=
// 32 * 127 * 8 < 2^15 is exact in f32, and its product with a bf16 scale (8 significant bits)
// has at most 23 significant bits, so the product is exact too; the only rounding is the
// addition, done once per group in the same order. Subnormal results (scales below ~1e-38) may
// be flushed to zero by the AIE float unit. Unverified on hardware: `npu-designs verify` says.
#include "gemm_common.h"

#ifndef Q4_GROUP
#error "Q4_GROUP is set by npu-designs build"
#endif
static_assert(DIM_K % Q4_GROUP == 0 && Q4_GROUP % MMUL_S == 0, "K tile must be whole groups");

static inline void matmul_q4(const int8 *__restrict a, const uint8_t *__restrict codes,
                             const uint8_t *__restrict scale_bytes, float *__restrict c) {
  constexpr unsigned mb = DIM_M / MMUL_R, kb = DIM_K / MMUL_S, nb = DIM_N / MMUL_T;
  constexpr unsigned groups = DIM_K / Q4_GROUP, steps = Q4_GROUP / MMUL_S;
  constexpr unsigned size_c = MMUL_I8::size_C;
  // A block of codes: t x s 4-bit values, t * s / 2 bytes, each code + 8 (offset binary).
  constexpr unsigned code_block = MMUL_I8::size_B / 2;
  const bfloat16 *__restrict scales = (const bfloat16 *)scale_bytes;
  for (unsigned i = 0; i < mb; ++i) {
    for (unsigned j = 0; j < nb; ++j) {
      float *__restrict pc = c + (i * nb + j) * size_c;
      aie::vector<float, size_c> acc = aie::load_v<size_c>(pc);
      for (unsigned g = 0; g < groups; ++g) {
        MMUL_I8 dot;
        for (unsigned x = 0; x < steps; ++x) {
          const unsigned step = g * steps + x;
          aie::vector<int8, MMUL_I8::size_A> va =
              aie::load_v<MMUL_I8::size_A>(a + (i * kb + step) * MMUL_I8::size_A);
          aie::vector<uint4, MMUL_I8::size_B> vq = aie::load_v<MMUL_I8::size_B>(
              (const uint4 *)(codes + (j * kb + step) * code_block));
          // Zero-extended nibbles 0..15, less 8: the codes -8..7 the int8 intrinsic multiplies.
          aie::vector<int8, MMUL_I8::size_B> vb =
              aie::sub(aie::vector_cast<int8>(aie::unpack(vq)), (int8)8);
          if (x == 0)
            dot.mul(va, b_operand(vb));
          else
            dot.mac(va, b_operand(vb));
        }
        // The block's r x t scales: column n's scale of group g, the same down the r rows.
        aie::vector<float, size_c> sv;
        for (unsigned col = 0; col < MMUL_T; ++col) {
          const float s = (float)scales[(j * MMUL_T + col) * groups + g];
          for (unsigned row = 0; row < MMUL_R; ++row)
            sv[row * MMUL_T + col] = s;
        }
        aie::vector<float, size_c> dotf = aie::to_float(dot.template to_vector<int32>(), 0);
        aie::vector<float, size_c> product = aie::mul(dotf, sv).template to_vector<float>();
        acc = aie::add(acc, product);
      }
      aie::store_v(pc, acc);
    }
  }
}

extern "C" {

void xdna_vl_zero_f32(float *c) { zero_tile<float>(c); }

void xdna_vl_matmul_q4(int8 *a, uint8_t *codes, uint8_t *scales, float *c) {
  matmul_q4(a, codes, scales, c);
}

} // extern "C"
