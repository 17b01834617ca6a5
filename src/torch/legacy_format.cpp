#include "torch/legacy_format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "ckptfs/error.hpp"
#include "torch/tensor_builder.hpp"

namespace ckptfs::torch {

namespace {

using pickle::Kind;

// PROTO 2, LONG1 of 0x1950a86a20f9469cfc6c, STOP.
constexpr std::array<uint8_t, 15> kMagicPickle{0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                               0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
constexpr std::string_view kMagicBytes = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
constexpr int64_t kProtocolVersion = 1001;
constexpr uint64_t kFirstRead = 1 << 20;

struct Pickles {
  pickle::ValuePtr root;
  std::vector<std::string> keys;
  uint64_t end = 0;  // where the storages start
};

// Unpickles the pickles at the start of `prefix`; throws pickle::TruncatedError when they run past it.
Pickles read_pickles(std::span<const std::byte> prefix, TensorBuilder& builder) {
  size_t pos = 0;
  const auto next = [&](const pickle::UnpickleOptions& options, std::string_view what) {
    size_t consumed = 0;
    try {
      auto v = pickle::unpickle(prefix.subspan(pos), options, &consumed);
      pos += consumed;
      return v;
    } catch (const pickle::TruncatedError&) {
      throw;
    } catch (const UnsupportedError& e) {
      throw UnsupportedError(fmt::format("legacy {} pickle at byte {}: {}", what, pos, e.what()));
    } catch (const FormatError& e) {
      throw FormatError(fmt::format("legacy {} pickle at byte {}: {}", what, pos, e.what()));
    }
  };
  const auto magic = next({}, "magic number");
  if (magic->kind != Kind::BigInt || magic->text != kMagicBytes)
    throw FormatError("not a torch.save file: no zip header and no legacy magic number");
  const auto protocol = next({}, "protocol version");
  if (protocol->kind != Kind::Int || protocol->integer != kProtocolVersion)
    throw FormatError(
        fmt::format("legacy protocol version is a {}, expected {}", protocol->describe(), kProtocolVersion));
  const auto sys_info = next({}, "sys_info");
  if (const auto* little = sys_info->find("little_endian");
      little && little->kind == Kind::Bool && !little->boolean)
    throw UnsupportedError("big-endian legacy files are not supported");

  Pickles out;
  out.root = next(builder.options(), "object");
  const auto keys = next({}, "storage key list");
  if (keys->kind != Kind::List)
    throw FormatError(fmt::format("legacy storage key list is a {}", keys->describe()));
  for (const auto& key : keys->items) {
    if (key->kind != Kind::String)
      throw FormatError(fmt::format("legacy storage key is a {}", key->describe()));
    out.keys.push_back(key->text);
  }
  out.end = pos;
  return out;
}

// Walks the storages after the pickles: per key a u64 element count then the bytes.
std::map<std::string, StorageSpan> walk_storages(const io::FilePtr& file, const Pickles& pickles,
                                                 const std::map<std::string, RootStorage>& storages) {
  std::map<std::string, StorageSpan> spans;
  uint64_t cursor = pickles.end;
  for (const std::string& key : pickles.keys) {
    auto it = storages.find(key);
    if (it == storages.end())
      throw FormatError(fmt::format("legacy storage '{}' is listed but never referenced", key));
    if (file->size() - cursor < 8)
      throw FormatError(
          fmt::format("truncated legacy file: storage '{}' header at {} past the end", key, cursor));
    const auto header = file->read(cursor, 8);
    uint64_t count = 0;
    for (size_t i = 0; i < 8; ++i) count |= std::to_integer<uint64_t>(header[i]) << (8 * i);
    const uint64_t item = dtype_size(it->second.dtype);
    const uint64_t offset = cursor + 8;
    if (count > (file->size() - offset) / item)
      throw FormatError(fmt::format("truncated legacy file: storage '{}' of {} x {} at {} runs past the end",
                                    key, count, dtype_torch_name(it->second.dtype), offset));
    if (count != it->second.numel)
      throw FormatError(fmt::format("legacy storage '{}' holds {} elements but is referenced with {}", key,
                                    count, it->second.numel));
    if (!spans.emplace(key, StorageSpan{file, offset, count * item}).second)
      throw FormatError(fmt::format("legacy storage '{}' is listed twice", key));
    cursor = offset + count * item;
  }
  return spans;
}

}  // namespace

bool is_legacy_file(const io::File& file) {
  if (file.size() < kMagicPickle.size()) return false;
  const auto head = file.read(0, kMagicPickle.size());
  return std::equal(head.begin(), head.end(), kMagicPickle.begin(),
                    [](std::byte a, uint8_t b) { return std::to_integer<uint8_t>(a) == b; });
}

pickle::ValuePtr read_legacy(const io::FilePtr& file) {
  // The pickles' length is only known by parsing them: read a prefix, and a longer one while they run
  // past it.
  for (uint64_t length = std::min(file->size(), kFirstRead);; length = std::min(file->size(), length * 2)) {
    const auto prefix = file->read(0, length);
    TensorBuilder builder;
    Pickles pickles;
    try {
      pickles = read_pickles(prefix, builder);
    } catch (const pickle::TruncatedError& e) {
      if (length == file->size()) throw FormatError(fmt::format("truncated legacy file: {}", e.what()));
      continue;
    }
    const auto spans = walk_storages(file, pickles, builder.storages());
    builder.resolve([&](const std::string& key, const RootStorage&) {
      auto it = spans.find(key);
      if (it == spans.end())
        throw FormatError(fmt::format("legacy storage '{}' is missing from the key list", key));
      return it->second;
    });
    return pickles.root;
  }
}

}  // namespace ckptfs::torch
