// max_shard_size and the split of save_pretrained (transformers 5.x), which calls huggingface_hub's
// split_torch_state_dict_into_shards: include/ckptfs/sharding.hpp.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "ckptfs/sharding.hpp"

namespace ckptfs::views {

namespace {

constexpr std::string_view kSizeSyntax =
    "expected bytes (60000) or a number and a unit: KB, MB, GB, TB (decimal, as transformers' "
    "max_shard_size: "
    "\"5GB\", \"1.5GB\") or KiB, MiB, GiB (binary, a whole number)";

std::string_view trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\v\f";
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

bool all_digits(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// `s` ends with `unit`, compared case-insensitively (as parse_size_to_int upper-cases the unit).
bool ends_with_unit(std::string_view s, std::string_view unit) {
  if (s.size() <= unit.size()) return false;
  const std::string_view tail = s.substr(s.size() - unit.size());
  for (size_t i = 0; i < unit.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(tail[i])) != unit[i]) return false;
  return true;
}

std::optional<uint64_t> parse_bytes(std::string_view digits) {
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return n;
}

// A decimal number as Python's float() reads one, less what makes no size (a sign, inf, nan, "1_000"):
// digits with an optional fraction and exponent.
std::optional<double> parse_decimal(std::string_view s) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i - from;
  };
  size_t mantissa = digits();
  if (i < s.size() && s[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<uint64_t> parse_size(std::string_view s) {
  if (all_digits(s)) return parse_bytes(s);
  // transformers' convert_file_size_to_int: int(size[:-3]) * 2**k
  constexpr std::array<std::pair<std::string_view, unsigned>, 3> kBinary = {
      {{"KIB", 10}, {"MIB", 20}, {"GIB", 30}}};
  for (const auto& [unit, shift] : kBinary)
    if (ends_with_unit(s, unit)) {
      const auto n = parse_bytes(trim(s.substr(0, s.size() - unit.size())));
      if (!n || *n > (UINT64_MAX >> shift)) return std::nullopt;
      return *n << shift;
    }
  // huggingface_hub's parse_size_to_int: int(float(size[:-2].strip()) * 10**k)
  constexpr std::array<std::pair<std::string_view, double>, 4> kDecimal = {
      {{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}}};
  for (const auto& [unit, multiplier] : kDecimal)
    if (ends_with_unit(s, unit)) {
      const auto value = parse_decimal(trim(s.substr(0, s.size() - unit.size())));
      if (!value) return std::nullopt;
      const double bytes = *value * multiplier;
      if (!(bytes < 18446744073709551616.0)) return std::nullopt;  // 2^64
      return static_cast<uint64_t>(bytes);                         // truncated, as Python's int()
    }
  return std::nullopt;
}

}  // namespace

uint64_t parse_shard_size(std::string_view text) {
  const auto size = parse_size(trim(text));
  if (!size) throw std::invalid_argument(fmt::format("'{}' is not a size: {}", text, kSizeSyntax));
  return *size;
}

std::vector<std::vector<size_t>> plan_shards(const catalog::Catalog& catalog, std::span<const size_t> order,
                                             uint64_t max_shard_size) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  for (size_t i : order) {
    const uint64_t size = catalog.tensors[i].nbytes();
    if (size > max_shard_size) {
      shards.push_back({i});
      continue;
    }
    if (current_size + size > max_shard_size) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += size;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::vector<size_t> state_dict_order(const catalog::Catalog& view, const catalog::Catalog& model) {
  std::unordered_map<std::string_view, size_t> position;
  for (size_t i = 0; i < model.tensors.size(); ++i) position.emplace(model.tensors[i].name, i);
  const auto rank = [&](size_t i) {
    const auto it = position.find(view.tensors[i].name);
    return it == position.end() ? SIZE_MAX : it->second;
  };
  std::vector<size_t> order(view.tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank(a) < rank(b); });
  return order;
}

std::string shard_file_name(size_t index, size_t count) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

}  // namespace ckptfs::views
