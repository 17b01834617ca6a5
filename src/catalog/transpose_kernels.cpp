// Transpose kernels: blocks of kTransposeBlock source rows so that each output row gets whole cache lines,
// and SIMD blocks (SSE2) for 16-bit and 32-bit elements.
#include "catalog/transpose_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ckptfs::catalog {

namespace {

template <size_t kSize>
void transpose_scalar(const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
                      uint64_t n_k, uint64_t n_i) {
  for (uint64_t kb = 0; kb < n_k; kb += kTransposeBlock)
    for (uint64_t i = 0; i < n_i; ++i)
      for (uint64_t k = kb; k < std::min(n_k, kb + kTransposeBlock); ++k)
        std::memcpy(dst + (i * dst_stride + k) * kSize, src + (k * src_stride + i) * kSize, kSize);
}

#if defined(__SSE2__)
// One 8 x 8 block of 16-bit elements; strides in bytes.
void transpose_8x8_16(const std::byte* s, uint64_t ss, std::byte* d, uint64_t ds) {
  __m128i r[8], t[8], u[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * ss));
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h)  // rows 0-3, 4-7
    for (int k = 0; k < 2; ++k) {
      u[4 * h + 2 * k] = _mm_unpacklo_epi32(t[4 * h + k], t[4 * h + k + 2]);
      u[4 * h + 2 * k + 1] = _mm_unpackhi_epi32(t[4 * h + k], t[4 * h + k + 2]);
    }
  for (int c = 0; c < 4; ++c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * c) * ds), _mm_unpacklo_epi64(u[c], u[c + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * c + 1) * ds), _mm_unpackhi_epi64(u[c], u[c + 4]));
  }
}

// One 4 x 4 block of 32-bit elements; strides in bytes.
void transpose_4x4_32(const std::byte* s, uint64_t ss, std::byte* d, uint64_t ds) {
  __m128i r[4];
  for (int k = 0; k < 4; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * ss));
  const __m128i t0 = _mm_unpacklo_epi32(r[0], r[1]), t1 = _mm_unpackhi_epi32(r[0], r[1]);
  const __m128i t2 = _mm_unpacklo_epi32(r[2], r[3]), t3 = _mm_unpackhi_epi32(r[2], r[3]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_unpacklo_epi64(t0, t2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + ds), _mm_unpackhi_epi64(t0, t2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * ds), _mm_unpacklo_epi64(t1, t3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 3 * ds), _mm_unpackhi_epi64(t1, t3));
}

// The blocks of kMicro x kMicro elements through `kernel`, the edges element by element. Each kMicro output
// rows take all n_k source rows in turn: the n_k lines of the band they read stay in L1 for the next
// kMicro, and each output row is written n_k elements at a stretch (whole cache lines): about 1.5x the rate
// of passes of kTransposeBlock source rows over the band's whole width (measured on bf16 column tiles).
template <size_t kSize, uint64_t kMicro, auto kernel>
void transpose_simd(const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
                    uint64_t n_k, uint64_t n_i) {
  const uint64_t k_main = n_k / kMicro * kMicro, i_main = n_i / kMicro * kMicro;
  for (uint64_t i = 0; i < i_main; i += kMicro)
    for (uint64_t k = 0; k < k_main; k += kMicro)
      kernel(src + (k * src_stride + i) * kSize, src_stride * kSize, dst + (i * dst_stride + k) * kSize,
             dst_stride * kSize);
  transpose_scalar<kSize>(src + k_main * src_stride * kSize, src_stride, dst + k_main * kSize, dst_stride,
                          n_k - k_main, n_i);
  transpose_scalar<kSize>(src + i_main * kSize, src_stride, dst + i_main * dst_stride * kSize, dst_stride,
                          k_main, n_i - i_main);
}
#endif

}  // namespace

void transpose(uint64_t size, const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
               uint64_t n_k, uint64_t n_i) {
  switch (size) {
    case 1:
      return transpose_scalar<1>(src, src_stride, dst, dst_stride, n_k, n_i);
#if defined(__SSE2__)
    case 2:
      return transpose_simd<2, 8, transpose_8x8_16>(src, src_stride, dst, dst_stride, n_k, n_i);
    case 4:
      return transpose_simd<4, 4, transpose_4x4_32>(src, src_stride, dst, dst_stride, n_k, n_i);
#else
    case 2:
      return transpose_scalar<2>(src, src_stride, dst, dst_stride, n_k, n_i);
    case 4:
      return transpose_scalar<4>(src, src_stride, dst, dst_stride, n_k, n_i);
#endif
    case 8:
      return transpose_scalar<8>(src, src_stride, dst, dst_stride, n_k, n_i);
    default:
      throw std::logic_error("a transpose of elements of " + std::to_string(size) +
                             " bytes");  // validate refuses them
  }
}

}  // namespace ckptfs::catalog
