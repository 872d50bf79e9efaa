// A host stand-in for the few parts of AMD's AIE API (aie_api/aie.hpp) the xdna-vl kernels use,
// so that tests/kernels_on_host.rs can compile designs/kernels/*.cc with the host C++ compiler
// and check their block indexing and summation order against packs::quant. It models the
// documented semantics (mmul: C[r x t] += A[r x s] * B[s x t], all row-major; transpose of a
// Row x Col row-major matrix; uint4 unpack zero-extends, the even element in the low nibble) with
// IEEE float arithmetic. It says nothing about the AIE's own float rounding or performance.
#ifndef XDNA_VL_HOST_AIE_API
#define XDNA_VL_HOST_AIE_API

#include <cstdint>
#include <cstring>

using int8 = int8_t;
using uint8 = uint8_t;
using int32 = int32_t;
struct acc32 {};
struct uint4 {
  uint8_t byte;
};
struct bfloat16 {
  uint16_t bits;
  operator float() const {
    uint32_t wide = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &wide, 4);
    return f;
  }
};

namespace aie {

template <typename T, unsigned N> struct vector {
  T v[N];
  T &operator[](unsigned i) { return v[i]; }
  const T &operator[](unsigned i) const { return v[i]; }
};

template <unsigned N, typename T> vector<T, N> load_v(const T *p) {
  vector<T, N> out;
  for (unsigned i = 0; i < N; ++i)
    out[i] = p[i];
  return out;
}

// uint4: N values packed two per byte.
template <unsigned N> vector<uint4, N> load_v(const uint4 *p) {
  const uint8_t *bytes = reinterpret_cast<const uint8_t *>(p);
  vector<uint4, N> out;
  for (unsigned i = 0; i < N; ++i)
    out[i].byte = (i % 2 == 0) ? (bytes[i / 2] & 0xF) : (bytes[i / 2] >> 4);
  return out;
}

template <typename T, unsigned N> void store_v(T *p, const vector<T, N> &v) {
  for (unsigned i = 0; i < N; ++i)
    p[i] = v[i];
}

template <typename T, unsigned N> vector<T, N> zeros() {
  vector<T, N> out;
  for (unsigned i = 0; i < N; ++i)
    out[i] = T(0);
  return out;
}

template <typename T, unsigned N>
vector<T, N> transpose(const vector<T, N> &v, unsigned rows, unsigned cols) {
  vector<T, N> out;
  for (unsigned i = 0; i < rows; ++i)
    for (unsigned j = 0; j < cols; ++j)
      out[j * rows + i] = v[i * cols + j];
  return out;
}

template <unsigned N> vector<uint8, N> unpack(const vector<uint4, N> &v) {
  vector<uint8, N> out;
  for (unsigned i = 0; i < N; ++i)
    out[i] = v[i].byte;
  return out;
}

// The same bits as another element type (only same-sized elements here).
template <typename D, typename T, unsigned N> vector<D, N> vector_cast(const vector<T, N> &v) {
  static_assert(sizeof(D) == sizeof(T), "vector_cast: same-sized elements only");
  vector<D, N> out;
  std::memcpy(out.v, v.v, sizeof(out.v));
  return out;
}

// The scalar subtracted from every element, wrapping as the AIE's integer lanes do.
template <typename T, unsigned N> vector<T, N> sub(const vector<T, N> &v, T s) {
  vector<T, N> out;
  for (unsigned i = 0; i < N; ++i)
    out[i] = T(v[i] - s);
  return out;
}

template <unsigned N> vector<float, N> to_float(const vector<int32, N> &v, int shift) {
  vector<float, N> out;
  for (unsigned i = 0; i < N; ++i)
    out[i] = float(v[i]) / float(1u << shift);
  return out;
}

template <unsigned N> struct float_accum {
  vector<float, N> value;
  template <typename T> vector<T, N> to_vector() const { return value; }
};

template <unsigned N>
float_accum<N> mul(const vector<float, N> &a, const vector<float, N> &b) {
  float_accum<N> out;
  for (unsigned i = 0; i < N; ++i)
    out.value[i] = a[i] * b[i];
  return out;
}

template <unsigned N>
vector<float, N> add(const vector<float, N> &a, const vector<float, N> &b) {
  vector<float, N> out;
  for (unsigned i = 0; i < N; ++i)
    out[i] = a[i] + b[i];
  return out;
}

template <unsigned R, unsigned S, unsigned T, typename TA, typename TB, typename Acc>
struct mmul {
  static constexpr unsigned size_A = R * S, size_B = S * T, size_C = R * T;
  int32 acc[size_C];
  mmul() { std::memset(acc, 0, sizeof acc); }
  explicit mmul(const vector<int32, size_C> &c) {
    for (unsigned i = 0; i < size_C; ++i)
      acc[i] = c[i];
  }
  void mac(const vector<TA, size_A> &a, const vector<TB, size_B> &b) {
    for (unsigned i = 0; i < R; ++i)
      for (unsigned j = 0; j < T; ++j)
        for (unsigned x = 0; x < S; ++x)
          acc[i * T + j] += int32(a[i * S + x]) * int32(b[x * T + j]);
  }
  void mul(const vector<TA, size_A> &a, const vector<TB, size_B> &b) {
    std::memset(acc, 0, sizeof acc);
    mac(a, b);
  }
  template <typename TO> vector<TO, size_C> to_vector() const {
    vector<TO, size_C> out;
    for (unsigned i = 0; i < size_C; ++i)
      out[i] = TO(acc[i]);
    return out;
  }
};

} // namespace aie

#endif
