#include "index/index_file.hpp"

#include <fmt/format.h>
#include <lz4frame.h>

#include <memory>
#include <new>

#include "ckptfs/error.hpp"
#include "index/byte_stream.hpp"
#include "index/checkpoint_fields.hpp"

namespace ckptfs::index {

namespace {

constexpr std::string_view kMagic = "CKPTFSIX";
constexpr size_t kChunk = 1 << 20;  // decompressed per call

[[noreturn]] void damaged(size_t code) {
  throw FormatError(fmt::format("index: damaged lz4 frame ({})", LZ4F_getErrorName(code)));
}

std::string compress_frame(std::string_view body) {
  LZ4F_preferences_t prefs{};
  prefs.frameInfo.blockSizeID = LZ4F_max4MB;
  prefs.frameInfo.blockChecksumFlag = LZ4F_blockChecksumEnabled;
  prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
  prefs.frameInfo.contentSize = body.size();
  std::string frame(LZ4F_compressFrameBound(body.size(), &prefs), '\0');
  const size_t n = LZ4F_compressFrame(frame.data(), frame.size(), body.data(), body.size(), &prefs);
  if (LZ4F_isError(n))
    throw UnsupportedError(fmt::format("index: lz4 compression failed ({})", LZ4F_getErrorName(n)));
  frame.resize(n);
  return frame;
}

std::string decompress_frame(std::string_view frame) {
  LZ4F_dctx* raw = nullptr;
  if (LZ4F_isError(LZ4F_createDecompressionContext(&raw, LZ4F_VERSION))) throw std::bad_alloc();
  const std::unique_ptr<LZ4F_dctx, decltype(&LZ4F_freeDecompressionContext)> ctx(
      raw, LZ4F_freeDecompressionContext);
  std::string out;
  size_t at = 0;
  for (;;) {
    const size_t used = out.size();
    out.resize(used + kChunk);
    size_t produced = kChunk, consumed = frame.size() - at;
    const size_t hint =
        LZ4F_decompress(ctx.get(), out.data() + used, &produced, frame.data() + at, &consumed, nullptr);
    if (LZ4F_isError(hint)) damaged(hint);
    out.resize(used + produced);
    at += consumed;
    if (hint == 0) break;  // the frame ended and its content checksum matched
    if (produced == 0 && consumed == 0) throw FormatError("index: the lz4 frame is truncated");
    // LZ4 expands at most 255x: past that the frame is crafted, and decoding it would only fill memory.
    if (out.size() / 255 > frame.size())
      throw FormatError("index: the lz4 frame expands beyond lz4's own bound");
  }
  if (at != frame.size()) throw FormatError("index: bytes after the lz4 frame");
  return out;
}

}  // namespace

std::string pack_index(const IndexKey& key, std::string_view body) {
  ByteWriter out;
  out.data() += kMagic;
  out.u64(kFormatVersion);
  out.text(key.build_id);
  out.text(key.key);
  out.data() += compress_frame(body);
  return std::move(out.data());
}

std::string unpack_index(std::string_view file, const IndexKey& key) {
  if (!file.starts_with(kMagic)) throw FormatError("index: not a ckptfs index");
  ByteReader in(file.substr(kMagic.size()));
  if (in.u64() != kFormatVersion) throw StaleIndex("written by another index format");
  if (in.text() != key.build_id) throw StaleIndex("written by another ckptfs build");
  if (in.text() != key.key) throw StaleIndex("written by another ckptfs version or for other options");
  return decompress_frame(file.substr(file.size() - in.remaining()));
}

}  // namespace ckptfs::index
