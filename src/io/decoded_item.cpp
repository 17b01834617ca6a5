#include "io/decoded_item.hpp"

#include <fmt/format.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <vector>

#include "ckptfs/error.hpp"
#include "io/decoded_cache.hpp"
#include "io/source_caches.hpp"

namespace ckptfs::io {

namespace {

constexpr uint64_t kInputChunk = uint64_t{1} << 20;
constexpr uint64_t kMaxFrameHeader = 18;  // ZSTD_FRAMEHEADERSIZE_MAX, in zstd.h's static-only part

std::string where(const File& file, uint64_t offset, uint64_t length) {
  return fmt::format("{}: zstd item at bytes {}..{}", file.path().string(), offset, offset + length);
}

struct DStreamDeleter {
  void operator()(ZSTD_DStream* s) const { ZSTD_freeDStream(s); }
};

// Decodes the frame at [offset, offset + length) of `file` front to back, handing each decoded chunk and
// its position to `sink`, which returns false to stop early. Returns the decoded bytes seen. Throws
// `Err` (FormatError at mount time, SourceError at read time) when the bytes are not exactly one frame.
template <typename Err>
uint64_t decode_stream(const File& file, uint64_t offset, uint64_t length,
                       const std::function<bool(std::span<const std::byte>, uint64_t)>& sink) {
  std::unique_ptr<ZSTD_DStream, DStreamDeleter> stream(ZSTD_createDStream());
  if (!stream) throw std::bad_alloc();
  std::vector<std::byte> in(std::min(length, kInputChunk)), out(ZSTD_DStreamOutSize());
  uint64_t consumed = 0, produced = 0;
  size_t last = 1;  // ZSTD_decompressStream's hint: 0 once the frame is complete
  while (consumed < length) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(in.size(), length - consumed));
    file.read_exact(offset + consumed, std::span(in).first(n));
    ZSTD_inBuffer input{in.data(), n, 0};
    while (input.pos < input.size) {
      if (last == 0)
        throw Err(fmt::format("{}: bytes after the end of its frame", where(file, offset, length)));
      ZSTD_outBuffer output{out.data(), out.size(), 0};
      last = ZSTD_decompressStream(stream.get(), &output, &input);
      if (ZSTD_isError(last))
        throw Err(fmt::format("{}: {}", where(file, offset, length), ZSTD_getErrorName(last)));
      if (output.pos > 0 && !sink(std::span(out).first(output.pos), produced)) return produced + output.pos;
      produced += output.pos;
    }
    consumed += n;
  }
  // The frame may still hold decoded bytes that did not fit the output buffer.
  while (last != 0) {
    ZSTD_inBuffer input{nullptr, 0, 0};
    ZSTD_outBuffer output{out.data(), out.size(), 0};
    last = ZSTD_decompressStream(stream.get(), &output, &input);
    if (ZSTD_isError(last))
      throw Err(fmt::format("{}: {}", where(file, offset, length), ZSTD_getErrorName(last)));
    if (output.pos == 0)
      throw Err(fmt::format("{}: the frame is cut short (truncated)", where(file, offset, length)));
    if (!sink(std::span(out).first(output.pos), produced)) return produced + output.pos;
    produced += output.pos;
  }
  return produced;
}

using Bytes = DecodedCache::Bytes;

std::atomic<uint64_t> next_id{1};

}  // namespace

DecodedItem::DecodedItem(FilePtr backing, uint64_t offset, uint64_t length, uint64_t size)
    : backing_(std::move(backing)), offset_(offset), length_(length), size_(size), id_(next_id++) {}

std::shared_ptr<const DecodedItem> DecodedItem::zstd(FilePtr backing, uint64_t offset, uint64_t length) {
  const auto header = backing->read(offset, std::min(length, kMaxFrameHeader));
  const unsigned long long declared = ZSTD_getFrameContentSize(header.data(), header.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR)
    throw FormatError(
        fmt::format("{}: not a zstd frame (its magic number is missing)", where(*backing, offset, length)));
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN)  // reads check it
    return std::make_shared<const DecodedItem>(std::move(backing), offset, length, declared);
  // No declared size (python-zstandard's stream_writer, which DCP's ZStandard uses, records none): one
  // pass learns it and checks the frame whole, and keeps the bytes in the cache when they fit, for the
  // reads of the archive's directory and pickle that follow.
  DecodedCache& cache = backing->caches().decoded;
  const uint64_t capacity = cache.capacity();
  auto bytes = std::make_shared<std::vector<std::byte>>();
  const uint64_t size = decode_stream<FormatError>(*backing, offset, length, [&](auto chunk, uint64_t at) {
    if (bytes && at + chunk.size() <= capacity)
      bytes->insert(bytes->end(), chunk.begin(), chunk.end());
    else
      bytes.reset();
    return true;
  });
  auto item = std::make_shared<const DecodedItem>(std::move(backing), offset, length, size);
  if (bytes) cache.insert(item->id_, std::move(bytes));
  return item;
}

void DecodedItem::read(uint64_t offset, std::span<std::byte> dst) const {
  const uint64_t end = offset + dst.size();
  const auto wrong_size = [&](uint64_t got) {
    return SourceError(fmt::format("{}: decodes to {} bytes, not the {} it had when mounted",
                                   where(*backing_, offset_, length_), got, size_));
  };
  DecodedCache& cache = backing_->caches().decoded;
  if (size_ <= cache.capacity()) {
    Bytes bytes = cache.find(id_);
    if (!bytes) {
      auto whole = std::make_shared<std::vector<std::byte>>(size_);
      const uint64_t got =
          decode_stream<SourceError>(*backing_, offset_, length_, [&](auto chunk, uint64_t at) {
            if (at + chunk.size() > size_) return false;
            std::memcpy(whole->data() + at, chunk.data(), chunk.size());
            return true;
          });
      if (got != size_) throw wrong_size(got);
      bytes = whole;
      cache.insert(id_, bytes);
    }
    std::memcpy(dst.data(), bytes->data() + offset, dst.size());
    return;
  }
  // Larger than the whole cache: stream to the range, keeping none of it.
  uint64_t copied = 0;
  const uint64_t got = decode_stream<SourceError>(*backing_, offset_, length_, [&](auto chunk, uint64_t at) {
    const uint64_t lo = std::max(at, offset), hi = std::min(at + chunk.size(), end);
    if (lo < hi) {
      std::memcpy(dst.data() + (lo - offset), chunk.data() + (lo - at), hi - lo);
      copied += hi - lo;
    }
    return at + chunk.size() < end;
  });
  if (copied != dst.size()) throw wrong_size(got);
}

void DecodedItem::prefetch() const {
  backing_->prefetch(offset_, length_);
}

}  // namespace ckptfs::io
