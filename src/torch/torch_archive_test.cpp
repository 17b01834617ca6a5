#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ckptfs/error.hpp"
#include "ckptfs/torch.hpp"
#include "torch/test_support.hpp"

namespace ckptfs::torch {
namespace {

using test_support::build_zip;
using test_support::PickleWriter;
using test_support::TempFile;

TorchArchive open_zip(const TempFile& f) {
  return TorchArchive::open(io::File::open_standalone(f.path()));
}

std::string error_of(const std::string& content) {
  TempFile f(content);
  try {
    open_zip(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// {'a': tensor over storage 0, 'b': a view of the same storage}
std::string two_views_pickle(int32_t numel = 12) {
  return PickleWriter()
      .op("}(")
      .str("a")
      .tensor("FloatStorage", "0", numel, 0, {3, 4}, {4, 1})
      .str("b")
      .tensor("FloatStorage", "0", numel, 5, {2}, {4})
      .op("u")
      .done();
}

TEST(TorchArchive, TensorsResolveToSpans) {
  TempFile f(
      build_zip({{"data.pkl", two_views_pickle()}, {"data/0", std::string(48, 'x')}, {"version", "3\n"}}));
  auto archive = open_zip(f);
  EXPECT_TRUE(archive.is_zip());
  const SourceTensor* a = as_tensor(archive.root()->find("a"));
  const SourceTensor* b = as_tensor(archive.root()->find("b"));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->dtype, DType::F32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(a->numel(), 12u);
  EXPECT_TRUE(a->is_contiguous());
  EXPECT_FALSE(b->is_contiguous());
  EXPECT_EQ(a->storage.offset % 64, 0u);
  EXPECT_EQ(a->storage.nbytes, 48u);
  EXPECT_EQ(a->storage.offset, b->storage.offset);  // views share one span
  EXPECT_EQ(b->storage_offset, 5);
  EXPECT_EQ(a->storage.file, archive.file());
  EXPECT_EQ(as_tensor(archive.root().get()), nullptr);
  EXPECT_EQ(archive.root()->find("a")->describe(), "tensor");
}

TEST(TorchArchive, ArchiveNestedInAByteRange) {
  // A DCP .distcp file: torch.save archives back to back, each read in place from its byte range.
  const std::string first = build_zip({{"data.pkl", two_views_pickle()}, {"data/0", std::string(48, 'a')}});
  const std::string second = build_zip({{"data.pkl", two_views_pickle()}, {"data/0", std::string(48, 'b')}});
  const std::string head(100, '\0');
  TempFile f(head + first + second + "trailing");
  const auto file = io::File::open_standalone(f.path());
  const auto archive = TorchArchive::open(io::FileRange(file, head.size() + first.size(), second.size()));
  const SourceTensor* a = as_tensor(archive.root()->find("a"));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->storage.file, file);
  const auto bytes = file->read(a->storage.offset, a->storage.nbytes);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), std::string(48, 'b'));
  // a range past the file's end, and an archive cut short, name the file and the range
  EXPECT_THROW(io::FileRange(file, head.size(), 1u << 20), SourceError);
  try {
    TorchArchive::open(io::FileRange(file, head.size(), first.size() - 30));
    FAIL() << "a truncated nested archive opened";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("(bytes {}..", head.size())), std::string::npos)
        << e.what();
  }
}

TEST(TorchArchive, RecordSizeMismatch) {
  auto e = error_of(build_zip({{"data.pkl", two_views_pickle()}, {"data/0", std::string(40, 'x')}}));
  EXPECT_NE(e.find("record 'archive/data/0' holds 40 bytes but storage '0' is 12 x float32 (48 bytes)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("x.pt: "), std::string::npos) << e;  // messages start with the path
}

TEST(TorchArchive, MissingRecords) {
  auto e = error_of(build_zip({{"data/0", std::string(48, 'x')}}));
  EXPECT_NE(e.find("no record 'archive/data.pkl'"), std::string::npos) << e;
  e = error_of(build_zip({{"data.pkl", two_views_pickle()}}));
  EXPECT_NE(e.find("storage '0' has no record 'archive/data/0'"), std::string::npos) << e;
  e = error_of(build_zip({{"data.pkl", two_views_pickle()}, {"data/0", std::string(48, 'x'), 8}}));
  EXPECT_NE(e.find("compressed"), std::string::npos) << e;
}

TEST(TorchArchive, ViewsMustFitTheirStorage) {
  const auto check = [](int32_t offset, std::vector<int32_t> size, std::vector<int32_t> stride) {
    auto pkl = PickleWriter().tensor("FloatStorage", "0", 12, offset, size, stride).done();
    return error_of(build_zip({{"data.pkl", pkl}, {"data/0", std::string(48, 'x')}}));
  };
  EXPECT_EQ(check(0, {3, 4}, {4, 1}), "");
  EXPECT_EQ(check(11, {1}, {1}), "");
  EXPECT_EQ(check(100, {0, 4}, {4, 1}), "");  // zero-size tensors need no bytes
  EXPECT_EQ(check(0, {}, {}), "");            // a scalar
  EXPECT_NE(check(1, {3, 4}, {4, 1}).find("reaches past storage '0'"), std::string::npos);
  EXPECT_NE(check(0, {3, 5}, {4, 1}).find("reaches past"), std::string::npos);
  EXPECT_NE(check(12, {}, {}).find("reaches past"), std::string::npos);
  EXPECT_NE(check(-1, {1}, {1}).find("storage offset must be a non-negative int, found -1"),
            std::string::npos);
  EXPECT_NE(check(0, {2}, {-1}).find("stride must be a non-negative int"), std::string::npos);
  EXPECT_NE(check(0, {2, 2}, {1}).find("2 sizes but 1 strides"), std::string::npos);
  // Huge sizes and strides must not overflow the bound computation.
  EXPECT_NE(check(0, {2, 0x7fffffff}, {0x7fffffff, 0x7fffffff}).find("reaches past"), std::string::npos);
  EXPECT_EQ(check(0, {0x7fffffff, 0x7fffffff}, {0, 0}), "");  // broadcast view
}

TEST(TorchArchive, RebuildVariants) {
  PickleWriter w;
  w.op("}(");
  // _rebuild_parameter(tensor, True, OrderedDict())
  w.str("param").global("torch._utils", "_rebuild_parameter").op("(");
  w.tensor("HalfStorage", "0", 4, 0, {4}, {1}).op("\x88").global("collections", "OrderedDict").op(")RtR");
  // _rebuild_from_type_v2(_rebuild_tensor_v2, Tensor, (args), {'ds_id': 'x'})
  w.str("typed")
      .global("torch._tensor", "_rebuild_from_type_v2")
      .op("(")
      .global("torch._utils", "_rebuild_tensor_v2");
  w.global("torch", "Tensor")
      .op("(")
      .storage("HalfStorage", "0", 4)
      .integer(1)
      .ints({2})
      .ints({1})
      .op("\x89");
  w.global("collections", "OrderedDict").op(")Rt}").str("ds_id").str("x").op("stR");
  // _rebuild_tensor_v3(UntypedStorage of 8 bytes, 0, (2,), (1,), False, OrderedDict(), torch.uint32)
  w.str("v3")
      .global("torch._utils", "_rebuild_tensor_v3")
      .op("(")
      .storage("UntypedStorage", "1", 8)
      .integer(0);
  w.ints({2})
      .ints({1})
      .op("\x89")
      .global("collections", "OrderedDict")
      .op(")R")
      .global("torch", "uint32")
      .op("tR");
  // torch.Size((3, 4))
  w.str("size").global("torch", "Size").ints({3, 4}).op("\x85R");
  w.op("u");
  TempFile f(
      build_zip({{"data.pkl", w.done()}, {"data/0", std::string(8, 'h')}, {"data/1", std::string(8, 'u')}}));
  auto archive = open_zip(f);
  const auto* param = as_tensor(archive.root()->find("param"));
  ASSERT_NE(param, nullptr);
  EXPECT_TRUE(param->requires_grad);
  EXPECT_EQ(param->dtype, DType::F16);
  EXPECT_EQ(param->storage.nbytes, 8u);
  const auto* typed = as_tensor(archive.root()->find("typed"));
  ASSERT_NE(typed, nullptr);
  EXPECT_EQ(typed->storage_offset, 1);
  EXPECT_EQ(typed->storage.offset, param->storage.offset);
  const auto* v3 = as_tensor(archive.root()->find("v3"));
  ASSERT_NE(v3, nullptr);
  EXPECT_EQ(v3->dtype, DType::U32);
  EXPECT_EQ(v3->storage.nbytes, 8u);
  const auto* size = archive.root()->find("size");
  ASSERT_EQ(size->kind, pickle::Kind::Tuple);
  EXPECT_EQ(size->items.at(1)->integer, 4);
}

TEST(TorchArchive, StorageTypes) {
  const auto with_storage = [](std::string_view cls) {
    auto pkl = PickleWriter().tensor(cls, "0", 2, 0, {2}, {1}).done();
    return error_of(build_zip({{"data.pkl", pkl}, {"data/0", std::string(4, 'x')}}));
  };
  EXPECT_EQ(with_storage("BFloat16Storage"), "");
  EXPECT_NE(with_storage("QInt8Storage").find("storage type torch.QInt8Storage is not supported"),
            std::string::npos);
  EXPECT_NE(with_storage("Float").find("as storage type"), std::string::npos);
  // The storage class's module is ignored (torch.cuda.FloatStorage).
  auto pkl = PickleWriter().tensor("FloatStorage", "0", 1, 0, {1}, {1}).done();
  pkl.replace(pkl.find("ctorch\nFloat"), 7, "ctorch.cuda\n");
  TempFile f(build_zip({{"data.pkl", pkl}, {"data/0", std::string(4, 'x')}}));
  EXPECT_EQ(as_tensor(open_zip(f).root().get())->dtype, DType::F32);
}

TEST(TorchArchive, PickleErrorsNameTheFile) {
  auto e = error_of(build_zip({{"data.pkl", "\x80\x02\xff."}}));
  EXPECT_NE(e.find("x.pt: data.pkl: pickle: byte 2: unknown opcode 0xff"), std::string::npos) << e;
  e = error_of(build_zip({{"data.pkl", PickleWriter().op("(").str("other").op("tQ").done()}}));
  EXPECT_NE(e.find("unknown persistent id ('other', ...)"), std::string::npos) << e;
  e = error_of(build_zip({{"data.pkl", "\x80\x02K\x01."}, {"constants.pkl", ""}}));
  EXPECT_NE(e.find("TorchScript"), std::string::npos) << e;
  e = error_of("garbage that is neither zip nor pickle");
  EXPECT_NE(e.find("not a torch.save file"), std::string::npos) << e;
}

}  // namespace
}  // namespace ckptfs::torch
