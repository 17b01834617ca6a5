// The element conversions of llama.cpp's converter (gguf-py's quants.py over numpy), bit for bit: they
// differ from torch's (catalog/dtype_convert.hpp) in NaN payloads, so the gguf/ view has its own.
#pragma once

#include <cstdint>
#include <span>

namespace ckptfs::views::gguf {

// numpy's float32 -> float16 (npy_floatbits_to_halfbits): round to nearest even, subnormals included,
// overflow to inf, a NaN keeps the top of its payload and is not quieted.
uint16_t f32_to_f16(uint32_t f32_bits);
// numpy's float16 -> float32 (npy_halfbits_to_floatbits): exact, a NaN keeps its payload and is not quieted
// (torch's widening, catalog::convert, quiets it).
uint32_t f16_to_f32(uint16_t f16_bits);
// gguf-py's float32 -> bfloat16 (ggml_compute_fp32_to_bf16): a NaN quieted keeping its high payload bits,
// else round to nearest even.
uint16_t f32_to_bf16(uint32_t f32_bits);

inline constexpr uint64_t kQ8Block = 32;       // elements per Q8_0 block
inline constexpr uint64_t kQ8BlockBytes = 34;  // an f16 scale and 32 int8
// One Q8_0 block of 32 float32 elements (gguf-py's quantize_blocks for Q8_0): d = amax / 127, q = round half
// away from zero of x / d, written as f16(d) little-endian then the 32 int8.
void quantize_q8_0_block(std::span<const float, kQ8Block> x, std::span<uint8_t, kQ8BlockBytes> out);

}  // namespace ckptfs::views::gguf
