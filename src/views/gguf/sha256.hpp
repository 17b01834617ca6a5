// SHA-256 (FIPS 180-4) of a byte string, as lowercase hex: the converter names a pre-tokenizer by the
// digest of the ids its check text encodes to.
#pragma once

#include <string>
#include <string_view>

namespace ckptfs::views::gguf {

std::string sha256_hex(std::string_view bytes);

}  // namespace ckptfs::views::gguf
