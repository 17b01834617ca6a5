// Python int conversions for the pickle reader: LONG1/LONG4 bytes and protocol-0 decimal text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

namespace ckptfs::pickle {

// Python's default limit on int <-> decimal string conversion (sys.get_int_max_str_digits()); it also keeps
// the quadratic decimal conversion cheap.
inline constexpr size_t kMaxDecimalDigits = 4300;

// The value of a little-endian two's complement integer when it fits in int64.
std::optional<int64_t> int64_from_twos_complement(std::span<const std::byte> bytes);

// An int given as decimal text ("-12", "+7", "123456789012345678901234"): int64 when it fits, else the
// minimal little-endian two's complement bytes (Value::text of a BigInt). nullopt when malformed or longer
// than kMaxDecimalDigits.
std::optional<std::variant<int64_t, std::string>> parse_decimal_int(std::string_view text);

}  // namespace ckptfs::pickle
