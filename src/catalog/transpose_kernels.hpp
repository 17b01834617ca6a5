// The transpose of a band of source rows into a tile of a transposed tensor: SIMD blocks where the elements
// are 16-bit (8 x 8) or 32-bit (4 x 4), element by element otherwise and at the edges.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptfs::catalog {

// The source rows a pass of the element-by-element transpose covers (64 B of a bf16 output row): a tile
// built from bands of a multiple of it gives each output row whole cache lines.
inline constexpr uint64_t kTransposeBlock = 32;

// dst[i * dst_stride + k] = src[k * src_stride + i] for k < n_k, i < n_i, over elements of `size` bytes
// (1, 2, 4 or 8; strides in elements). Throws std::logic_error for another size (validate refuses them).
void transpose(uint64_t size, const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
               uint64_t n_k, uint64_t n_i);

}  // namespace ckptfs::catalog
