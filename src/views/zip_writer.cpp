#include "views/zip_writer.hpp"

#include "ckptfs/overloaded.hpp"

namespace ckptfs::views {

namespace {

constexpr uint64_t kU32Max = 0xFFFFFFFF;

// Appends little-endian integers to a header under construction.
class Header {
 public:
  Header& u16(uint64_t v) { return put(v, 2); }
  Header& u32(uint64_t v) { return put(v, 4); }
  Header& u64(uint64_t v) { return put(v, 8); }
  Header& bytes(std::string_view s) {
    text += s;
    return *this;
  }
  std::string text;

 private:
  Header& put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) text.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
};

// miniz writes a zip64 extra only when a size or the header offset reaches U32MAX, with just those fields.
std::string zip64_extra(uint64_t size, uint64_t offset) {
  Header body;
  if (size >= kU32Max) body.u64(size).u64(size);
  if (offset >= kU32Max) body.u64(offset);
  if (body.text.empty()) return {};
  return Header().u16(1).u16(body.text.size()).bytes(body.text).text;
}

}  // namespace

void append_zip(ExtentBuilder& out, std::string_view root, std::span<const ZipRecord> records) {
  const uint64_t archive_start = out.offset();
  Header central;
  for (const ZipRecord& r : records) {
    const std::string name = std::string(root) + "/" + r.name;
    const uint64_t size = std::visit(Overloaded{
                                         [](const std::string& bytes) -> uint64_t { return bytes.size(); },
                                         [](const catalog::TensorRef& tensor) { return tensor->nbytes(); },
                                     },
                                     r.content);
    const uint64_t cursor = out.offset() - archive_start;
    const std::string z64 = zip64_extra(size, cursor);
    const uint64_t start = cursor + 30 + name.size() + z64.size() + 4;
    const uint64_t pad = (kZipAlignment - start % kZipAlignment) % kZipAlignment;
    const uint16_t flags = size > 0 ? 0x0808 : 0x0800;  // data descriptor follows, UTF-8 name

    Header local;
    local.u32(0x04034b50).u16(0).u16(flags).u16(0).u16(0).u16(0).u32(0).u32(0).u32(0);
    local.u16(name.size()).u16(z64.size() + 4 + pad).bytes(name).bytes(z64);
    local.bytes("FB").u16(pad).bytes(std::string(pad, 'Z'));
    out.append(local.text);
    std::visit(Overloaded{
                   [&](const std::string& bytes) { out.append(bytes); },
                   [&](const catalog::TensorRef& tensor) { out.append(tensor); },
               },
               r.content);
    if (size > 0) {
      Header descriptor;
      descriptor.u32(0x08074b50).u32(0);
      if (z64.empty())
        descriptor.u32(size).u32(size);
      else
        descriptor.u64(size).u64(size);
      out.append(descriptor.text);
    }

    central.u32(0x02014b50).u16(0).u16(0).u16(flags).u16(0).u16(0).u16(0).u32(0);
    central.u32(std::min(size, kU32Max)).u32(std::min(size, kU32Max));
    central.u16(name.size()).u16(z64.size()).u16(0).u16(0).u16(0).u32(0).u32(std::min(cursor, kU32Max));
    central.bytes(name).bytes(z64);
  }

  const uint64_t n = records.size();
  const uint64_t cd_offset = out.offset() - archive_start;
  const uint64_t cd_size = central.text.size();
  const uint64_t eocd64_offset = cd_offset + cd_size;
  Header tail;
  tail.u32(0x06064b50)
      .u64(44)
      .u16(0x031E)
      .u16(0x002D)
      .u32(0)
      .u32(0)
      .u64(n)
      .u64(n)
      .u64(cd_size)
      .u64(cd_offset);
  tail.u32(0x07064b50).u32(0).u64(eocd64_offset).u32(1);
  tail.u32(0x06054b50).u16(0).u16(0).u16(std::min<uint64_t>(n, 0xFFFF)).u16(std::min<uint64_t>(n, 0xFFFF));
  tail.u32(std::min(cd_size, kU32Max)).u32(std::min(cd_offset, kU32Max)).u16(0);
  out.append(central.text);
  out.append(tail.text);
}

}  // namespace ckptfs::views
