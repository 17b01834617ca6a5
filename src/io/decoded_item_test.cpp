// Compressed items as sources of their decoded bytes: frames with and without a content size, reads
// through the bounded cache and past it (streamed), and bad frames at mount time and at read time.
#include "io/decoded_item.hpp"

#include <gtest/gtest.h>
#include <zstd.h>

#include <string>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "io/runtime.hpp"
#include "vfs/test_files.hpp"

namespace ckptfs::io {
namespace {

using testing::TempDir;

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u) >> 13);
  return s;
}

// One frame that records its content size (one-shot compression)...
std::string frame_with_size(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// ... and one that does not (as python-zstandard's stream_writer, which DCP uses, writes), with a
// checksum of the content when asked (DCP writes none: then a flipped literal byte goes unnoticed by any
// decoder).
std::string frame_without_size(const std::string& data, bool checksum = false) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, checksum ? 1 : 0);
  std::string out(ZSTD_compressBound(data.size()) + 64, '\0');
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  while (ZSTD_compressStream2(cctx, &o, &in, ZSTD_e_end) != 0) {
  }
  ZSTD_freeCCtx(cctx);
  out.resize(o.pos);
  return out;
}

std::string read_range(const File& f, uint64_t offset, uint64_t length) {
  const auto b = f.read(offset, length);
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

class DecodedItemTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(DecodedItemTest, ServesTheDecodedBytesOfFramesWithAndWithoutContentSize) {
  const std::string data = pattern(300'000);
  for (const auto& frame : {frame_with_size(data), frame_without_size(data)}) {
    const std::string lead = "0123456789";
    const FilePtr backing = File::open_standalone(dir_.write("items.distcp", lead + frame + "tail"));
    const FilePtr f = File::decoded(DecodedItem::zstd(backing, lead.size(), frame.size()));
    ASSERT_EQ(f->size(), data.size());
    EXPECT_EQ(f->path(), backing->path());
    EXPECT_FALSE(DiskFileRef::of(f).has_value());
    EXPECT_TRUE(f->unchanged());
    EXPECT_EQ(read_range(*f, 0, data.size()), data);
    EXPECT_EQ(read_range(*f, 123'457, 77'000), data.substr(123'457, 77'000));
    EXPECT_THROW(f->read(data.size() - 1, 2), SourceError);
  }
}

TEST_F(DecodedItemTest, AnItemLargerThanTheCacheIsStreamedToTheRangeAndNotKept) {
  const std::string data = pattern(1'500'000);  // decodes in many output chunks
  const std::string frame = frame_without_size(data);
  const auto path = dir_.write("big.distcp", frame);
  for (const uint64_t cache_bytes : {uint64_t{1} << 20, uint64_t{4} << 20}) {
    RuntimeOptions options;
    options.decoded_cache_bytes = cache_bytes;
    Runtime runtime(options);
    const FilePtr f =
        File::decoded(DecodedItem::zstd(runtime.open_local(dir_.path())->open(path), 0, frame.size()));
    EXPECT_EQ(read_range(*f, 1'200'001, 299'999), data.substr(1'200'001));
    EXPECT_EQ(read_range(*f, 5, 1), data.substr(5, 1));
    // Kept (after the first pass, which learnt its size) only when it fits.
    EXPECT_EQ(runtime.caches().decoded.used(), data.size() <= cache_bytes ? data.size() : 0);
    EXPECT_EQ(read_range(*f, 999'999, 2), data.substr(999'999, 2));
  }
}

TEST_F(DecodedItemTest, BytesThatAreNotOneWholeFrameFailAtMountNamingTheFileAndRange) {
  const std::string frame = frame_without_size(pattern(5000));
  const FilePtr not_zstd = File::open_standalone(dir_.write("a.distcp", "PK\x03\x04 a zip, not zstd"));
  try {
    DecodedItem::zstd(not_zstd, 0, not_zstd->size());
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("a.distcp: zstd item at bytes 0..20: not a zstd frame"),
              std::string::npos)
        << e.what();
  }
  const FilePtr cut = File::open_standalone(dir_.write("b.distcp", frame.substr(0, frame.size() - 3)));
  EXPECT_THROW(DecodedItem::zstd(cut, 0, cut->size()), FormatError);
  const FilePtr trailing = File::open_standalone(dir_.write("c.distcp", frame + frame));
  EXPECT_THROW(DecodedItem::zstd(trailing, 0, trailing->size()), FormatError);
  std::string flipped = frame_without_size(pattern(5000), true);
  flipped[flipped.size() / 2] ^= 0x5A;
  const FilePtr corrupt = File::open_standalone(dir_.write("d.distcp", flipped));
  EXPECT_THROW(DecodedItem::zstd(corrupt, 0, corrupt->size()), FormatError);
}

TEST_F(DecodedItemTest, AFrameThatNoLongerDecodesFailsTheReadWithSourceError) {
  // The size was learnt at mount time (here: given); the bytes read later are corrupt or decode to a
  // different size. Each read fails (the mount turns that into EIO) and later reads still try again.
  const std::string data = pattern(50'000);
  const std::string frame = frame_without_size(data, true);
  std::string flipped = frame;
  flipped[flipped.size() / 2] ^= 0x5A;
  const FilePtr backing = File::open_standalone(dir_.write("e.distcp", flipped));
  const FilePtr f =
      File::decoded(std::make_shared<const DecodedItem>(backing, 0, flipped.size(), data.size()));
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      f->read(0, 10);
      FAIL();
    } catch (const SourceError& e) {
      EXPECT_NE(std::string(e.what()).find("e.distcp: zstd item at bytes 0.."), std::string::npos)
          << e.what();
    }
  }
  const FilePtr other = File::open_standalone(dir_.write("f.distcp", frame));
  const FilePtr wrong =
      File::decoded(std::make_shared<const DecodedItem>(other, 0, frame.size(), data.size() + 1));
  EXPECT_THROW(wrong->read(0, 10), SourceError);
}

}  // namespace
}  // namespace ckptfs::io
