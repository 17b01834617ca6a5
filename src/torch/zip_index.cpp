#include "torch/zip_index.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <span>

#include "ckptfs/error.hpp"

namespace ckptfs::torch {

namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kEndSize = 22, kZip64EndSize = 56, kZip64LocatorSize = 20, kCentralSize = 46,
                 kLocalSize = 30;
constexpr uint32_t kU32Max = 0xffffffff;

// Little-endian field reader over a bounded buffer; every access is range checked.
class Reader {
 public:
  Reader(std::span<const std::byte> data, std::string_view what) : data_(data), what_(what) {}
  template <typename T>
  T get(size_t at) const {
    if (at > data_.size() || sizeof(T) > data_.size() - at)
      throw FormatError(fmt::format("truncated {}: field at {} past its {} bytes", what_, at, data_.size()));
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(std::to_integer<T>(data_[at + i]) << (8 * i));
    return v;
  }
  std::string_view text(size_t at, size_t n) const {
    if (at > data_.size() || n > data_.size() - at)
      throw FormatError(
          fmt::format("truncated {}: {} bytes at {} past its {} bytes", what_, n, at, data_.size()));
    return {reinterpret_cast<const char*>(data_.data() + at), n};
  }

 private:
  std::span<const std::byte> data_;
  std::string_view what_;
};

struct EndRecord {
  uint64_t entries = 0;
  uint64_t directory_size = 0;
  uint64_t directory_offset = 0;
  uint64_t end_offset = 0;  // where the end records start: the central directory must end before
};

EndRecord read_end_records(const io::FileRange& file) {
  const uint64_t size = file.size();
  if (size < kEndSize) throw FormatError("truncated zip: no end of central directory record");
  const uint64_t tail_len = std::min<uint64_t>(size, kEndSize + 0xffff + kZip64LocatorSize);
  const uint64_t tail_start = size - tail_len;
  const auto tail = file.read(tail_start, tail_len);
  const Reader r(tail, "zip end record");
  // The last signature whose comment fits in the file (torch writes no comment).
  std::optional<size_t> at;
  for (size_t i = tail.size() - kEndSize + 1; i-- > 0;) {
    if (r.get<uint32_t>(i) == kEndSig && i + kEndSize + r.get<uint16_t>(i + 20) <= tail.size()) {
      at = i;
      break;
    }
  }
  if (!at) throw FormatError("not a zip archive: no end of central directory record");
  EndRecord end;
  if (r.get<uint16_t>(*at + 4) != 0 || r.get<uint16_t>(*at + 6) != 0)
    throw FormatError("multi-disk zip archives are not supported");
  end.entries = r.get<uint16_t>(*at + 10);
  end.directory_size = r.get<uint32_t>(*at + 12);
  end.directory_offset = r.get<uint32_t>(*at + 16);
  end.end_offset = tail_start + *at;
  const bool saturated =
      end.entries == 0xffff || end.directory_size == kU32Max || end.directory_offset == kU32Max;
  if (*at < kZip64LocatorSize || r.get<uint32_t>(*at - kZip64LocatorSize) != kZip64LocatorSig) {
    if (saturated) throw FormatError("zip64 sizes in the end record but no zip64 locator");
    return end;
  }
  const uint64_t locator_offset = end.end_offset - kZip64LocatorSize;
  const uint64_t z64_offset = r.get<uint64_t>(*at - kZip64LocatorSize + 8);
  if (z64_offset > locator_offset || locator_offset - z64_offset < kZip64EndSize)
    throw FormatError(fmt::format("zip64 end record offset {} is not before its locator at {}", z64_offset,
                                  locator_offset));
  const auto z64 = file.read(z64_offset, kZip64EndSize);
  const Reader z(z64, "zip64 end record");
  if (z.get<uint32_t>(0) != kZip64EndSig)
    throw FormatError(fmt::format("no zip64 end record at {}", z64_offset));
  if (z.get<uint32_t>(16) != 0 || z.get<uint32_t>(20) != 0)
    throw FormatError("multi-disk zip archives are not supported");
  end.entries = z.get<uint64_t>(32);
  end.directory_size = z.get<uint64_t>(40);
  end.directory_offset = z.get<uint64_t>(48);
  end.end_offset = z64_offset;
  return end;
}

// Replaces saturated 32-bit fields with their values from the zip64 extra field (in the order the format
// fixes: size, compressed size, local header offset).
void apply_zip64_extra(const Reader& r, size_t at, size_t len, ZipEntry& e) {
  for (size_t pos = 0; pos + 4 <= len;) {
    const uint16_t id = r.get<uint16_t>(at + pos);
    const uint16_t field_len = r.get<uint16_t>(at + pos + 2);
    if (pos + 4 + field_len > len)
      throw FormatError(fmt::format("record '{}': extra field overruns", e.name));
    if (id == 0x0001) {
      size_t off = at + pos + 4;
      const size_t field_end = off + field_len;
      for (uint64_t* v : {&e.size, &e.compressed_size, &e.local_header_offset}) {
        if (*v != kU32Max) continue;
        if (off + 8 > field_end)
          throw FormatError(fmt::format("record '{}': zip64 extra field too short", e.name));
        *v = r.get<uint64_t>(off);
        off += 8;
      }
      return;
    }
    pos += 4 + field_len;
  }
}

}  // namespace

ZipIndex ZipIndex::read(const io::FileRange& file) {
  const EndRecord end = read_end_records(file);
  if (end.directory_offset > end.end_offset || end.directory_size > end.end_offset - end.directory_offset)
    throw FormatError(
        fmt::format("truncated zip: central directory ({} bytes at {}) ends past its end records at {}",
                    end.directory_size, end.directory_offset, end.end_offset));
  if (end.entries == 0) throw FormatError("empty zip archive");
  if (end.entries > end.directory_size / kCentralSize)
    throw FormatError(
        fmt::format("zip lists {} records in a {}-byte central directory", end.entries, end.directory_size));
  const auto directory = file.read(end.directory_offset, end.directory_size);
  const Reader r(directory, "zip central directory");
  ZipIndex index;
  index.directory_offset_ = end.directory_offset;
  index.entries_.reserve(static_cast<size_t>(end.entries));
  size_t pos = 0;
  for (uint64_t i = 0; i < end.entries; ++i) {
    if (r.get<uint32_t>(pos) != kCentralSig)
      throw FormatError(
          fmt::format("bad central directory entry {} at offset {}", i, end.directory_offset + pos));
    ZipEntry e;
    e.flags = r.get<uint16_t>(pos + 8);
    e.method = r.get<uint16_t>(pos + 10);
    e.compressed_size = r.get<uint32_t>(pos + 20);
    e.size = r.get<uint32_t>(pos + 24);
    const uint16_t name_len = r.get<uint16_t>(pos + 28);
    const uint16_t extra_len = r.get<uint16_t>(pos + 30);
    const uint16_t comment_len = r.get<uint16_t>(pos + 32);
    e.local_header_offset = r.get<uint32_t>(pos + 42);
    e.name = std::string(r.text(pos + kCentralSize, name_len));
    r.text(pos + kCentralSize + name_len, size_t{extra_len} + comment_len);  // bounds check
    apply_zip64_extra(r, pos + kCentralSize + name_len, extra_len, e);
    if (e.size == kU32Max || e.compressed_size == kU32Max || e.local_header_offset == kU32Max)
      throw FormatError(
          fmt::format("record '{}': saturated size or offset without a zip64 extra field", e.name));
    pos += kCentralSize + name_len + extra_len + comment_len;
    index.entries_.push_back(std::move(e));
  }
  const std::string& first = index.entries_.front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos)
    throw FormatError(fmt::format("first zip record '{}' is not inside a top folder", first));
  index.root_ = first.substr(0, slash);
  const std::string prefix = index.root_ + "/";
  for (size_t i = 0; i < index.entries_.size(); ++i) {
    const std::string& name = index.entries_[i].name;
    if (name.starts_with(prefix)) index.by_name_.emplace(name.substr(prefix.size()), i);
  }
  return index;
}

const ZipEntry* ZipIndex::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

void ZipIndex::check_stored(const ZipEntry& e) const {
  if (e.flags & 1) throw FormatError(fmt::format("record '{}' is encrypted", e.name));
  if (e.method != 0)
    throw FormatError(fmt::format("record '{}' is compressed (method {}); only stored records are supported",
                                  e.name, e.method));
  if (e.compressed_size != e.size)
    throw FormatError(fmt::format("stored record '{}' has compressed size {} but size {}", e.name,
                                  e.compressed_size, e.size));
  if (e.local_header_offset > directory_offset_ || directory_offset_ - e.local_header_offset < kLocalSize)
    throw FormatError(
        fmt::format("record '{}': local header offset {} is outside the records (which end at {})", e.name,
                    e.local_header_offset, directory_offset_));
}

namespace {

// The length of the name in the local header `header` (its first kLocalSize bytes) of record `e`.
uint64_t local_name_length(const ZipEntry& e, std::span<const std::byte> header) {
  const Reader r(header, "zip local header");
  if (r.get<uint32_t>(0) != kLocalHeaderSig)
    throw FormatError(
        fmt::format("record '{}': no local header at offset {}", e.name, e.local_header_offset));
  return r.get<uint16_t>(26);
}

}  // namespace

// `header` has passed local_name_length().
RecordSpan ZipIndex::span_from_local_header(const ZipEntry& e, std::span<const std::byte> header,
                                            std::span<const std::byte> local_name) const {
  const Reader r(header, "zip local header");
  // The local extra length differs from the central one (torch pads with an 'FB' extra field).
  const uint64_t name_len = r.get<uint16_t>(26);
  const uint64_t extra_len = r.get<uint16_t>(28);
  const uint64_t data_offset = e.local_header_offset + kLocalSize + name_len + extra_len;
  if (data_offset > directory_offset_ || e.size > directory_offset_ - data_offset)
    throw FormatError(fmt::format("record '{}': {} bytes at offset {} run past the records (which end at {})",
                                  e.name, e.size, data_offset, directory_offset_));
  if (local_name.size() != name_len ||
      std::string_view(reinterpret_cast<const char*>(local_name.data()), local_name.size()) != e.name)
    throw FormatError(
        fmt::format("record '{}': local header at {} names another record", e.name, e.local_header_offset));
  return {data_offset, e.size};
}

RecordSpan ZipIndex::locate(const io::FileRange& file, const ZipEntry& e) const {
  check_stored(e);
  const auto header = file.read(e.local_header_offset, kLocalSize);
  const uint64_t name_len = local_name_length(e, header);
  if (name_len > directory_offset_ - e.local_header_offset - kLocalSize)
    throw FormatError(
        fmt::format("record '{}': its local header's name runs past the records (which end at {})", e.name,
                    directory_offset_));
  const auto local_name = file.read(e.local_header_offset + kLocalSize, name_len);
  return span_from_local_header(e, header, local_name);
}

std::vector<RecordSpan> ZipIndex::locate_all(const io::FileRange& file,
                                             const std::vector<const ZipEntry*>& entries) const {
  for (const ZipEntry* e : entries) check_stored(*e);
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries[a]->local_header_offset < entries[b]->local_header_offset;
  });
  // A header and the name it should have: the bytes each record needs (a longer local name is read alone).
  const auto window_end = [&](const ZipEntry& e) {
    return std::min(directory_offset_, e.local_header_offset + kLocalSize + e.name.size());
  };
  const uint64_t gap = file.file()->read_gap_bytes();
  // Records whose headers lie close together are read at once: [first, last) of `order`, bytes [start, end).
  struct Group {
    size_t first, last;
    uint64_t start, end;
  };
  std::vector<Group> groups;
  for (size_t first = 0; first < order.size();) {
    Group g{first, first + 1, entries[order[first]]->local_header_offset, window_end(*entries[order[first]])};
    for (; g.last < order.size() && entries[order[g.last]]->local_header_offset <= g.end + gap; ++g.last)
      g.end = std::max(g.end, window_end(*entries[order[g.last]]));
    groups.push_back(g);
    first = g.last;
  }
  // An object store answers each read after a round trip: start them all, then read them in order.
  if (file.file()->is_remote() && groups.size() > 1)
    for (const Group& g : groups) file.prefetch(g.start, g.end - g.start);
  std::vector<RecordSpan> out(entries.size());
  for (const auto& [first, last, start, end] : groups) {
    const auto bytes = file.read(start, end - start);
    for (size_t k = first; k < last; ++k) {
      const ZipEntry& e = *entries[order[k]];
      const auto header = std::span(bytes).subspan(e.local_header_offset - start, kLocalSize);
      const uint64_t name_at = e.local_header_offset - start + kLocalSize;
      const uint64_t name_len = local_name_length(e, header);
      out[order[k]] = name_len <= bytes.size() - name_at
                          ? span_from_local_header(e, header, std::span(bytes).subspan(name_at, name_len))
                          : locate(file, e);
    }
  }
  return out;
}

std::optional<ZipIndex::TorchPlacement> ZipIndex::torch_placement(const io::FileRange& file,
                                                                  const ZipEntry& e) const {
  check_stored(e);
  constexpr uint64_t kTorchAlignment = 64, kPaddingFieldHeader = 4;
  if (e.size >= kU32Max || e.local_header_offset >= kU32Max || e.name.size() > 0xffff) return std::nullopt;
  const uint64_t name_end = e.local_header_offset + kLocalSize + e.name.size();
  const uint64_t data =
      (name_end + kPaddingFieldHeader + kTorchAlignment - 1) / kTorchAlignment * kTorchAlignment;
  if (data > directory_offset_ || e.size > directory_offset_ - data) return std::nullopt;
  const auto le = [](uint64_t v, size_t bytes) {
    std::string out(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<char>(v >> (8 * i));
    return out;
  };
  const uint64_t at = file.base() + e.local_header_offset;
  io::Expectation header{file.base() + data,
                         file.base() + data + e.size,
                         {{at, le(kLocalHeaderSig, 4)},
                          {at + 26, le(e.name.size(), 2) + le(data - name_end, 2)},
                          {at + kLocalSize, e.name}},
                         fmt::format("the local header of record '{}'", e.name)};
  return TorchPlacement{{data, e.size}, std::move(header)};
}

std::vector<std::byte> ZipIndex::read(const io::FileRange& file, const ZipEntry& entry) const {
  const RecordSpan span = locate(file, entry);
  return file.read(span.offset, span.size);
}

}  // namespace ckptfs::torch
