// Test helpers: a small writer of torch-style zip archives and protocol-2 pickles, and a temp file.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::torch::test_support {

inline void put16(std::string& s, uint16_t v) {
  for (int i = 0; i < 2; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
inline void put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
inline void put64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

struct ZipRecord {
  std::string name;  // without the top folder
  std::string data;
  uint16_t method = 0;
};

struct ZipOptions {
  std::string root = "archive";  // empty: names without a top folder
  bool zip64_tail = true;        // torch always writes the zip64 end records
  bool zip64_extras = false;     // saturate 32-bit fields and give the values in zip64 extra fields
};

// Records laid out as torch does: data 64-byte aligned through an 'FB' padding extra field.
inline std::string build_zip(const std::vector<ZipRecord>& records, const ZipOptions& opt = {}) {
  std::string out, central;
  for (const auto& r : records) {
    const std::string name = opt.root.empty() ? r.name : opt.root + "/" + r.name;
    const uint64_t offset = out.size();
    std::string z64;
    if (opt.zip64_extras) {
      put16(z64, 1);
      put16(z64, 24);
      put64(z64, r.data.size());
      put64(z64, r.data.size());
      put64(z64, offset);
    }
    const size_t start = offset + 30 + name.size() + z64.size() + 4;
    const size_t pad = (64 - start % 64) % 64;
    const uint32_t size32 = opt.zip64_extras ? 0xffffffff : static_cast<uint32_t>(r.data.size());
    out += "PK\x03\x04";
    put16(out, 0);
    put16(out, 0x0800);
    put16(out, r.method);
    put32(out, 0);
    put32(out, 0);  // crc (never checked)
    put32(out, size32);
    put32(out, size32);
    put16(out, static_cast<uint16_t>(name.size()));
    put16(out, static_cast<uint16_t>(z64.size() + 4 + pad));
    out += name + z64 + "FB";
    put16(out, static_cast<uint16_t>(pad));
    out += std::string(pad, 'Z') + r.data;

    central += "PK\x01\x02";
    put16(central, 0);
    put16(central, 0);
    put16(central, 0x0800);
    put16(central, r.method);
    put32(central, 0);
    put32(central, 0);
    put32(central, size32);
    put32(central, size32);
    put16(central, static_cast<uint16_t>(name.size()));
    put16(central, static_cast<uint16_t>(z64.size()));
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put32(central, 0);
    put32(central, opt.zip64_extras ? 0xffffffff : static_cast<uint32_t>(offset));
    central += name + z64;
  }
  const uint64_t cd_offset = out.size();
  out += central;
  const uint64_t z64_offset = out.size();
  if (opt.zip64_tail) {
    out += "PK\x06\x06";
    put64(out, 44);
    put16(out, 0x031e);
    put16(out, 0x002d);
    put32(out, 0);
    put32(out, 0);
    put64(out, records.size());
    put64(out, records.size());
    put64(out, central.size());
    put64(out, cd_offset);
    out += "PK\x06\x07";
    put32(out, 0);
    put64(out, z64_offset);
    put32(out, 1);
  }
  out += "PK\x05\x06";
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint16_t>(opt.zip64_extras ? 0xffff : records.size()));
  put16(out, static_cast<uint16_t>(opt.zip64_extras ? 0xffff : records.size()));
  put32(out, opt.zip64_extras ? 0xffffffff : static_cast<uint32_t>(central.size()));
  put32(out, opt.zip64_extras ? 0xffffffff : static_cast<uint32_t>(cd_offset));
  put16(out, 0);
  return out;
}

// Protocol-2 pickle writer with the opcodes torch.save uses.
class PickleWriter {
 public:
  PickleWriter() { out_ = "\x80\x02"; }
  PickleWriter& op(std::string_view bytes) {
    out_ += bytes;
    return *this;
  }
  PickleWriter& global(std::string_view module, std::string_view name) {
    out_ += "c" + std::string(module) + "\n" + std::string(name) + "\n";
    return *this;
  }
  PickleWriter& str(std::string_view s) {
    out_ += "X";
    put32(out_, static_cast<uint32_t>(s.size()));
    out_ += s;
    return *this;
  }
  PickleWriter& integer(int32_t v) {
    out_ += "J";
    put32(out_, static_cast<uint32_t>(v));
    return *this;
  }
  PickleWriter& ints(const std::vector<int32_t>& values) {
    out_ += "(";
    for (int32_t v : values) integer(v);
    out_ += "t";
    return *this;
  }
  // ('storage', torch.<cls>, key, 'cpu', numel) BINPERSID
  PickleWriter& storage(std::string_view cls, std::string_view key, int32_t numel) {
    out_ += "(";
    str("storage").global("torch", cls).str(key).str("cpu").integer(numel);
    out_ += "tQ";
    return *this;
  }
  // _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())
  PickleWriter& tensor(std::string_view cls, std::string_view key, int32_t numel, int32_t offset,
                       const std::vector<int32_t>& size, const std::vector<int32_t>& stride) {
    global("torch._utils", "_rebuild_tensor_v2").op("(").storage(cls, key, numel).integer(offset).ints(size);
    ints(stride).op("\x89").global("collections", "OrderedDict").op(")R").op("tR");
    return *this;
  }
  std::string done() { return out_ + "."; }

 private:
  std::string out_;
};

// A file in the test's temp directory, removed at the end.
class TempFile {
 public:
  explicit TempFile(std::string_view content, std::string_view name = "x.pt")
      : path_(std::filesystem::temp_directory_path() /
              ("ckptfs_torch_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++) + "_" +
               std::string(name))) {
    std::ofstream(path_, std::ios::binary)
        .write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path path_;
};

}  // namespace ckptfs::torch::test_support
