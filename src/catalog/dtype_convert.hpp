// Element conversions between the dtype a source holds and the dtype a view serves, bit-exact with
// torch's CPU `Tensor.to()`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ckptfs/dtype.hpp"

namespace ckptfs::catalog {

// Same dtype, F16/BF16 and the float8 kinds widened to F32 (exact), or F32 rounded to F16/BF16.
bool conversion_supported(DType from, DType to);

// Converts src (elements of `from`) into dst (the same number of elements of `to`); the pair must be
// supported and not the identity.
void convert(DType from, DType to, std::span<const std::byte> src, std::span<std::byte> dst);

float f16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t b);
uint16_t f32_to_f16(float f);            // round to nearest even; overflow -> inf, NaN -> sign | 0x7E00
uint16_t f32_to_bf16(float f);           // round to nearest even; NaN -> 0xFFFF (torch's vectorised path)
bool is_float8(DType d);                 // F8_E5M2, F8_E4M3FN and their FNUZ kinds
float f8_to_f32(DType kind, uint8_t b);  // exact, NaNs as torch's `.float()` writes them

}  // namespace ckptfs::catalog
