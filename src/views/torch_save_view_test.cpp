// The torch.save view parsed back: our own walk of the zip (central directory, local headers, alignment),
// the project's torch reader, and, where Debian's python3-torch is installed, torch.load itself.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <variant>

#include "ckptfs/error.hpp"
#include "ckptfs/overloaded.hpp"
#include "ckptfs/torch.hpp"
#include "ckptfs/views.hpp"
#include "views/test_catalog.hpp"

namespace ckptfs::views {
namespace {

using testing::le;
using testing::read_file;
using testing::TestCatalog;

struct Entry {
  std::string name;
  uint16_t flags = 0;
  uint64_t size = 0;
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  bool zip64 = false;
};

// Walks the end records and the central directory (reading only the tail), then every local header.
std::vector<Entry> walk_zip(const VirtualFile& f) {
  const uint64_t size = f.size();
  const std::string eocd = read_file(f, size - 22, 22);
  EXPECT_EQ(le(eocd, 0, 4), 0x06054b50u);
  const std::string locator = read_file(f, size - 42, 20);
  EXPECT_EQ(le(locator, 0, 4), 0x07064b50u);
  const uint64_t eocd64_offset = le(locator, 8, 8);
  EXPECT_EQ(eocd64_offset, size - 42 - 56);
  const std::string eocd64 = read_file(f, eocd64_offset, 56);
  EXPECT_EQ(le(eocd64, 0, 4), 0x06064b50u);
  const uint64_t count = le(eocd64, 32, 8), cd_size = le(eocd64, 40, 8), cd_offset = le(eocd64, 48, 8);
  EXPECT_EQ(cd_offset + cd_size, eocd64_offset);
  EXPECT_EQ(le(eocd, 10, 2), std::min<uint64_t>(count, 0xFFFF));
  const std::string cd = read_file(f, cd_offset, cd_size);
  std::vector<Entry> entries;
  for (size_t p = 0; p < cd.size();) {
    EXPECT_EQ(le(cd, p, 4), 0x02014b50u);
    Entry e;
    e.flags = static_cast<uint16_t>(le(cd, p + 8, 2));
    e.size = le(cd, p + 24, 4);
    EXPECT_EQ(le(cd, p + 20, 4), e.size);
    e.header_offset = le(cd, p + 42, 4);
    const size_t name_len = le(cd, p + 28, 2), extra_len = le(cd, p + 30, 2);
    e.name = cd.substr(p + 46, name_len);
    if (extra_len > 0) {  // only the zip64 extra: sizes then offset, for the saturated fields
      e.zip64 = true;
      size_t q = p + 46 + name_len;
      EXPECT_EQ(le(cd, q, 2), 1u);
      q += 4;
      if (e.size == 0xFFFFFFFF) {
        e.size = le(cd, q, 8);
        q += 16;
      }
      if (e.header_offset == 0xFFFFFFFF) e.header_offset = le(cd, q, 8);
    }
    const std::string local = read_file(f, e.header_offset, 30);
    EXPECT_EQ(le(local, 0, 4), 0x04034b50u);
    EXPECT_EQ(le(local, 6, 2), e.flags);
    const size_t local_extra = le(local, 28, 2);
    EXPECT_EQ(read_file(f, e.header_offset + 30, name_len), e.name);
    const std::string extra = read_file(f, e.header_offset + 30 + name_len, local_extra);
    const size_t fb = extra.find("FB");
    EXPECT_EQ(le(extra, fb + 2, 2) + fb + 4, local_extra);  // the padding extra comes last
    e.data_offset = e.header_offset + 30 + name_len + local_extra;
    entries.push_back(e);
    p += 46 + name_len + extra_len;
  }
  EXPECT_EQ(entries.size(), count);
  return entries;
}

const std::vector<testing::TensorSpec> kSpecs = {{"model.embed.weight", DType::BF16, {7, 3}},
                                                 {"model.norm.weight", DType::F32, {5}},
                                                 {"model.layers.0.attn.qkv", DType::F16, {2, 2, 3}},
                                                 {"steps", DType::I64, {}},
                                                 {"empty", DType::F32, {0, 4}},
                                                 {"mask", DType::Bool, {3}}};

TEST(TorchSave, RecordsAreAlignedAndComplete) {
  const TestCatalog tc(kSpecs);
  const auto file = make_torch_save(tc.catalog(), "pytorch_model");
  const auto entries = walk_zip(*file);
  std::vector<std::string> names;
  for (const auto& e : entries) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "pytorch_model/data.pkl", "pytorch_model/.format_version",
                       "pytorch_model/.storage_alignment", "pytorch_model/byteorder", "pytorch_model/data/0",
                       "pytorch_model/data/1", "pytorch_model/data/2", "pytorch_model/data/3",
                       "pytorch_model/data/4", "pytorch_model/data/5", "pytorch_model/version"}));
  uint64_t end = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
    EXPECT_EQ(e.flags, e.size > 0 ? 0x0808 : 0x0800) << e.name;
    EXPECT_FALSE(e.zip64);
    EXPECT_EQ(e.header_offset, end) << e.name;  // records back to back, each with its data descriptor
    end = e.data_offset + e.size + (e.size > 0 ? 16 : 0);
    if (e.size > 0) {
      EXPECT_EQ(le(read_file(*file, e.data_offset + e.size, 16), 0, 4), 0x08074b50u);
    }
    if (i >= 4 && i < 10) {
      EXPECT_EQ(e.size, tc.catalog()->tensors[i - 4].nbytes()) << e.name;
      EXPECT_EQ(read_file(*file, e.data_offset, e.size), tc.bytes(i - 4)) << e.name;
    }
  }
  EXPECT_EQ(read_file(*file, entries[1].data_offset, 1), "1");
  EXPECT_EQ(read_file(*file, entries[2].data_offset, 2), "64");
  EXPECT_EQ(read_file(*file, entries[3].data_offset, 6), "little");
  EXPECT_EQ(read_file(*file, entries[10].data_offset, 2), "3\n");
  EXPECT_EQ(read_file(*file, 0, 4), "PK\x03\x04");
}

// Writes a virtual file to a temp file, removed at scope exit.
class Materialized {
 public:
  explicit Materialized(const VirtualFile& f, const std::string& suffix = "") {
    char name[] = "/tmp/ckptfs_view_XXXXXX";
    ::close(::mkstemp(name));
    ::unlink(name);
    path_ = std::string(name) + suffix;
    std::ofstream(path_, std::ios::binary) << read_file(f, 0, f.size());
  }
  ~Materialized() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(TorchSave, ProjectReaderFindsEveryTensor) {
  const TestCatalog tc(kSpecs);
  const Materialized out(*make_torch_save(tc.catalog(), "archive"));
  const auto archive = torch::TorchArchive::open(io::File::open_standalone(out.path()));
  const auto& root = *archive.root();
  ASSERT_EQ(root.kind, pickle::Kind::Dict);
  ASSERT_EQ(root.entries.size(), kSpecs.size());
  for (size_t i = 0; i < kSpecs.size(); ++i) {
    EXPECT_EQ(root.entries[i].first->text, kSpecs[i].name);
    const torch::SourceTensor* t = torch::as_tensor(*root.entries[i].second);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, kSpecs[i].dtype);
    EXPECT_EQ(t->shape, kSpecs[i].shape);
    EXPECT_TRUE(t->is_contiguous());
    EXPECT_EQ(t->storage.offset % 64, 0u);
    EXPECT_EQ(archive.file()->read(t->storage.offset, t->storage.nbytes).size(), tc.bytes(i).size());
    const auto bytes = archive.file()->read(t->storage.offset, t->storage.nbytes);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), tc.bytes(i));
  }
}

// Dtypes with no legacy storage class pickle as torch >= 2.1 does: _rebuild_tensor_v3 on
// torch.storage.UntypedStorage (the module torch.save names, the one weights_only=True allows; the
// global "torch UntypedStorage" is refused), then the dtype; our reader takes them back.
TEST(TorchSave, Float8AndWideUnsignedPickleUntypedStorageAsTorchDoes) {
  const std::vector<testing::TensorSpec> specs = {{"e4m3", DType::F8_E4M3FN, {3, 2}},
                                                  {"fnuz", DType::F8_E5M2FNUZ, {4}},
                                                  {"u16", DType::U16, {2}},
                                                  {"u64", DType::U64, {}}};
  const TestCatalog tc(specs);
  const Materialized out(*make_torch_save(tc.catalog(), "archive"));
  std::ifstream in(out.path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find("ctorch._utils\n_rebuild_tensor_v3\n"), std::string::npos);
  EXPECT_NE(bytes.find("ctorch.storage\nUntypedStorage\n"), std::string::npos);
  EXPECT_EQ(bytes.find("ctorch\nUntypedStorage\n"), std::string::npos);
  EXPECT_NE(bytes.find("ctorch\nfloat8_e5m2fnuz\n"), std::string::npos);
  const auto archive = torch::TorchArchive::open(io::File::open_standalone(out.path()));
  const auto& root = *archive.root();
  ASSERT_EQ(root.entries.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const torch::SourceTensor* t = torch::as_tensor(*root.entries[i].second);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, specs[i].dtype) << specs[i].name;
    EXPECT_EQ(t->shape, specs[i].shape);
    const auto b = archive.file()->read(t->storage.offset, t->storage.nbytes);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), b.size()), tc.bytes(i));
  }
}

TEST(TorchSave, Zip64RecordsPastFourGiB) {
  // A 4 GiB + 20 byte tensor whose bytes are never read: only headers and extents are checked.
  const TestCatalog tc({{"a", DType::F32, {3}}, {"c", DType::F16, {2}}});
  auto c = std::make_shared<catalog::Catalog>(*tc.catalog());
  constexpr uint64_t big_numel = (uint64_t{1} << 30) + 5;
  const auto& file_of_a = std::get<catalog::FlatRuns>(c->tensors[0].source).pieces[0].file;
  const catalog::LogicalTensor big{
      .name = "big",
      .dtype = DType::F32,
      .shape = {static_cast<int64_t>(big_numel)},
      .source = catalog::FlatRuns{{{.count = big_numel, .file = file_of_a, .src_dtype = DType::F32}}},
      .origin = {}};
  c->tensors.insert(c->tensors.begin() + 1, big);
  const auto file = make_torch_save(c, "archive");
  const auto& extents = dynamic_cast<const ExtentFile&>(*file).extents();
  const auto is_big = [&](const Extent& e) {
    return std::visit(Overloaded{[](const InlineBytes&) { return false; },
                                 [&](const TensorBytes& t) { return &*t.tensor == &c->tensors[1]; }},
                      e.source);
  };
  const auto big_extent = std::find_if(extents.begin(), extents.end(), is_big);
  ASSERT_NE(big_extent, extents.end());
  EXPECT_EQ(big_extent->offset % 64, 0u);
  EXPECT_EQ(big_extent->length, big.nbytes());
  // The data descriptor of a zip64 record has 64-bit sizes.
  const std::string descriptor = read_file(*file, big_extent->offset + big_extent->length, 24);
  EXPECT_EQ(le(descriptor, 0, 4), 0x08074b50u);
  EXPECT_EQ(le(descriptor, 8, 8), big.nbytes());
  EXPECT_EQ(le(descriptor, 16, 8), big.nbytes());

  const auto entries = walk_zip(*file);
  ASSERT_EQ(entries.size(), 8u);
  const Entry& big_entry = entries[5];  // data.pkl, 3 small records, data/0, data/1
  EXPECT_EQ(big_entry.name, "archive/data/1");
  EXPECT_TRUE(big_entry.zip64);
  EXPECT_EQ(big_entry.size, big.nbytes());
  EXPECT_EQ(big_entry.data_offset, big_extent->offset);
  for (size_t i = 6; i < entries.size(); ++i) {  // past 4 GiB: offsets only in the zip64 extra
    EXPECT_TRUE(entries[i].zip64) << entries[i].name;
    EXPECT_GT(entries[i].header_offset, 0xFFFFFFFFu);
    EXPECT_EQ(entries[i].data_offset % 64, 0u);
  }
  EXPECT_EQ(read_file(*file, entries[6].data_offset, 4), tc.bytes(1));
  EXPECT_EQ(read_file(*file, entries[7].data_offset, 2), "3\n");
  EXPECT_GT(file->size(), big.nbytes());
}

TEST(TorchSave, DuplicateNamesAreAnError) {
  const TestCatalog dup({{"w", DType::F32, {2}}, {"w", DType::F32, {2}}});
  EXPECT_THROW(make_torch_save(dup.catalog(), "archive"), FormatError);
}

TEST(TorchSave, TorchLoadsItAndWritesTheSamePickle) {
  const char* python = "/usr/bin/python3";
  if (::access(python, X_OK) != 0 || std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0)
    GTEST_SKIP() << "no /usr/bin/python3 with torch";
  const TestCatalog tc(kSpecs);
  const auto file = make_torch_save(tc.catalog(), "pytorch_model");
  const Materialized bin(*file, ".bin");
  const auto entries = walk_zip(*file);
  const std::string pickle = read_file(*file, entries[0].data_offset, entries[0].size);
  const std::string pkl_path = bin.path() + ".pkl", out_path = bin.path() + ".out";
  std::ofstream(pkl_path, std::ios::binary) << pickle;
  // torch.load(weights_only=True) must accept it; every tensor's bytes are printed as hex, and torch.save
  // of what was loaded must produce our data.pkl byte for byte.
  const std::string script = R"(
import io, sys, zipfile, torch
sd = torch.load(sys.argv[1], weights_only=True)
with open(sys.argv[3], 'w') as out:
    for name, t in sd.items():
        out.write(name + ' ' + str(t.dtype) + ' ' + str(list(t.shape)) + ' ' +
                  bytes(t.reshape(-1).view(torch.uint8).tolist()).hex() + '\n')
buf = io.BytesIO()
torch.save(sd, buf)
ours = open(sys.argv[2], 'rb').read()
theirs = zipfile.ZipFile(buf).read('archive/data.pkl')
sys.exit(0 if ours == theirs else 3)
)";
  const std::string script_path = bin.path() + ".py";
  std::ofstream(script_path) << script;
  const int rc =
      std::system(fmt::format("{} {} {} {} {}", python, script_path, bin.path(), pkl_path, out_path).c_str());
  std::ifstream in(out_path);
  std::map<std::string, std::string> got;
  for (std::string name, dtype, shape, hex; in >> name >> dtype;) {
    std::getline(in, shape);
    got[name] = dtype + shape;
  }
  for (const auto& p : {pkl_path, out_path, script_path}) ::unlink(p.c_str());
  EXPECT_EQ(rc, 0) << "exit status 3 (768): torch.save wrote a different data.pkl";
  ASSERT_EQ(got.size(), kSpecs.size());
  for (size_t i = 0; i < kSpecs.size(); ++i) {
    std::string hex;
    for (unsigned char ch : tc.bytes(i)) hex += fmt::format("{:02x}", ch);
    const std::string shape = fmt::format("[{}]", fmt::join(kSpecs[i].shape, ", "));
    EXPECT_EQ(got[kSpecs[i].name],
              fmt::format("torch.{} {} {}", dtype_torch_name(kSpecs[i].dtype), shape, hex));
  }
}

}  // namespace
}  // namespace ckptfs::views
