// A reference-model test of the read path of object-store files (as mountpoint-s3's reftests do): a fake
// store behind the block cache and the readers the mount uses, with a cache small enough to evict, driven
// by seeded random operations (open, read at any offset and size, past the end too, prefetch, a bound
// expectation, the source replacing an object, close). After every operation the outcome is compared with
// a model that only remembers the bytes each open saw, by the rule docs/s3.md states: a read gives the
// bytes of the object as it was at the open, or fails (SourceError, EIO on the mount) once the object has
// been replaced; never bytes of another version, never a short read.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ckptfs/error.hpp"
#include "ckptfs/s3_cache.hpp"
#include "io/remote_object.hpp"
#include "io/runtime.hpp"

namespace ckptfs::io {
namespace {

using Bytes = std::vector<std::byte>;

// Objects by key, each version with an ETag of its own; a GET pinned to an older ETag fails as S3's
// If-Match does (412). Counts what it serves.
class FakeStore : public s3::RangeReader {
 public:
  s3::ObjectInfo put(const std::string& key, Bytes bytes) {
    std::lock_guard lock(mutex_);
    Object& o = objects_[key];
    o.etag = "\"v" + std::to_string(++versions_) + "\"";
    o.bytes = std::move(bytes);
    return {key, o.bytes.size(), o.etag, "Fri, 04 Dec 2026 00:00:00 GMT"};
  }
  s3::ObjectInfo info(const std::string& key) const {
    std::lock_guard lock(mutex_);
    const Object& o = objects_.at(key);
    return {key, o.bytes.size(), o.etag, "Fri, 04 Dec 2026 00:00:00 GMT"};
  }
  void read_range(const s3::ObjectId& id, std::uint64_t offset, std::span<std::byte> dst) override {
    std::lock_guard lock(mutex_);
    ++gets_;
    const Object& o = objects_.at(id.key);
    if (o.etag != id.etag)
      throw s3::ObjectChangedError("s3://bucket/" + id.key + ": HTTP 412", 412, "PreconditionFailed");
    if (id.size != o.bytes.size() || offset > o.bytes.size() || dst.size() > o.bytes.size() - offset) {
      bad_gets_.push_back(id.key + " at " + std::to_string(offset) + "+" + std::to_string(dst.size()));
      throw s3::Error("s3://bucket/" + id.key + ": HTTP 416", 416, "InvalidRange");
    }
    std::memcpy(dst.data(), o.bytes.data() + offset, dst.size());
    fetched_ += dst.size();
  }
  std::uint64_t gets() const {
    std::lock_guard lock(mutex_);
    return gets_;
  }
  std::vector<std::string> bad_gets() const {
    std::lock_guard lock(mutex_);
    return bad_gets_;
  }

 private:
  struct Object {
    std::string etag;
    Bytes bytes;
  };
  mutable std::mutex mutex_;
  std::map<std::string, Object> objects_;
  int versions_ = 0;
  std::uint64_t gets_ = 0, fetched_ = 0;
  std::vector<std::string> bad_gets_;
};

// What an open saw: the object's bytes then, and a guarded range whose expected bytes are wrong (a parse's
// trust the object does not bear out: every read touching the range fails).
struct ModelOpen {
  std::string key;
  s3::ObjectInfo info;
  Bytes bytes;
  std::optional<std::pair<uint64_t, uint64_t>> failing_guard;
};

struct Handle {
  ModelOpen model;
  std::shared_ptr<RemoteReader> reader;
};

Bytes random_bytes(std::mt19937_64& rng, uint64_t n) {
  Bytes out(n);
  for (uint64_t i = 0; i < n; i += 8) {
    const uint64_t word = rng();
    std::memcpy(out.data() + i, &word, std::min<uint64_t>(8, n - i));
  }
  return out;
}

// Sizes from a byte to a few blocks, weighted to the small reads a parse makes and the large ones of views.
uint64_t random_length(std::mt19937_64& rng, uint64_t object_size) {
  switch (rng() % 4) {
    case 0:
      return 1 + rng() % 64;
    case 1:
      return 1 + rng() % (8 << 10);
    case 2:
      return 1 + rng() % (100 << 10);
    default:
      return 1 + rng() % std::max<uint64_t>(object_size, 1);
  }
}

RuntimeOptions small_cache() {
  RuntimeOptions o;
  o.remote.memory_bytes = 1 << 20;  // about two objects' worth: reads and prefetches evict each other
  o.remote.block_bytes = 128 << 10;
  o.remote.align_bytes = 4 << 10;
  o.remote.connections = 3;
  return o;
}

class ReadPathModel {
 public:
  explicit ReadPathModel(uint64_t seed, bool prefetches = true)
      : rng_(seed),
        prefetches_(prefetches),
        runtime_(small_cache()),
        store_(std::make_shared<FakeStore>()),
        cache_(runtime_.remote_cache(store_)) {
    for (int i = 0; i < 4; ++i) change(fmt_key(i));
  }

  // One random operation, checked against the model; returns a description for failure messages.
  std::string step() {
    const uint64_t op = rng_() % 100;
    if (handles_.empty() || op < 10) return open();
    Handle& h = handles_[rng_() % handles_.size()];
    if (op < 70) return read(h);
    if (op < 80) return reread(h);
    if (op < 88 && prefetches_) return prefetch(h);
    if (op < 94) return change(h.model.key);
    return close();
  }

  uint64_t reads_checked() const { return reads_checked_; }
  uint64_t failures_allowed_seen() const { return failures_allowed_seen_; }
  const FakeStore& store() const { return *store_; }
  const RemoteCache& cache() const { return *cache_; }

 private:
  static std::string fmt_key(int i) { return "ckpt/rank" + std::to_string(i) + ".pt"; }

  std::string open() {
    const std::string key = fmt_key(static_cast<int>(rng_() % 4));
    Handle h;
    h.model.key = key;
    h.model.info = store_->info(key);
    h.model.bytes = current_.at(key);
    h.reader = std::make_shared<RemoteReader>(cache_, "bucket", h.model.info);
    const uint64_t size = h.model.bytes.size();
    if (size > 16 && rng_() % 4 == 0) {
      // A parse that placed bytes by what a header said: the pieces lie before the guarded range.
      const uint64_t at = rng_() % (size - 8), guard_begin = at + 8,
                     guard_end = std::min(size, guard_begin + 1 + rng_() % 4096);
      const bool right = rng_() % 2 == 0;
      std::string piece(reinterpret_cast<const char*>(h.model.bytes.data() + at), 8);
      if (!right) piece[rng_() % 8] ^= 0x5a;
      h.reader->expect({guard_begin, guard_end, {{at, piece}}, "a test header"});
      if (!right) h.model.failing_guard = {{guard_begin, guard_end}};
    }
    handles_.push_back(std::move(h));
    return "open " + key;
  }

  std::string read(Handle& h) {
    const uint64_t size = h.model.bytes.size();
    uint64_t offset = rng_() % (size + 1);
    if (rng_() % 8 == 0) offset = size - std::min<uint64_t>(size, rng_() % 300);  // near and at the end
    const uint64_t length = rng_() % 10 == 0 ? size - offset + 1 + rng_() % 100 : random_length(rng_, size);
    return check_read(h, offset, std::min(length, size + 200 - offset), false);
  }

  // The range a reader just read, read again: served from what the first read left, no GET (the cache holds
  // far more than one read).
  std::string reread(Handle& h) {
    const uint64_t size = h.model.bytes.size();
    if (size == 0) return "reread of an empty object";
    const uint64_t offset = rng_() % size, length = 1 + rng_() % std::min<uint64_t>(size - offset, 128 << 10);
    check_read(h, offset, length, false);
    return check_read(h, offset, length, true);
  }

  std::string prefetch(Handle& h) {
    const uint64_t size = h.model.bytes.size();
    const uint64_t offset = rng_() % (size + 1), length = random_length(rng_, size);
    h.reader->prefetch(offset, length);  // never throws, never changes what reads give
    return "prefetch " + h.model.key + " " + std::to_string(offset) + "+" + std::to_string(length);
  }

  std::string change(const std::string& key) {
    uint64_t size = rng_() % (768 << 10);
    if (current_.contains(key) && rng_() % 3 == 0)
      size = current_.at(key).size();  // rewritten at the same size
    current_[key] = random_bytes(rng_, size);
    store_->put(key, current_[key]);
    return "replace " + key + " (" + std::to_string(size) + " bytes)";
  }

  std::string close() {
    handles_.erase(handles_.begin() + static_cast<std::ptrdiff_t>(rng_() % handles_.size()));
    return "close";
  }

  std::string check_read(Handle& h, uint64_t offset, uint64_t length, bool no_get) {
    const ModelOpen& m = h.model;
    const std::string what = "read " + m.key + " " + m.info.etag + " " + std::to_string(offset) + "+" +
                             std::to_string(length) + " of " + std::to_string(m.bytes.size());
    const bool past_end = offset > m.bytes.size() || length > m.bytes.size() - offset;
    const bool guarded =
        m.failing_guard && offset < m.failing_guard->second && offset + length > m.failing_guard->first;
    const bool replaced = store_->info(m.key).etag != m.info.etag;
    Bytes got(length);
    const uint64_t gets_before = store_->gets();
    std::optional<std::string> error;
    try {
      h.reader->read(offset, got);
    } catch (const SourceError& e) {
      error = e.what();
    }
    ++reads_checked_;
    if (past_end || guarded) {
      EXPECT_TRUE(error) << what << ": served, where the model says SourceError";
      return what;
    }
    if (error) {
      EXPECT_TRUE(replaced) << what << ": " << *error << ", of an object that has not changed";
      ++failures_allowed_seen_;
      return what;
    }
    EXPECT_TRUE(std::equal(got.begin(), got.end(), m.bytes.begin() + static_cast<std::ptrdiff_t>(offset)))
        << what << ": not the bytes of the object as it was at the open";
    if (no_get && !prefetches_) {
      EXPECT_EQ(store_->gets(), gets_before) << what << ": fetched again";
    }
    return what;
  }

  std::mt19937_64 rng_;
  bool prefetches_;
  Runtime runtime_;
  std::shared_ptr<FakeStore> store_;
  std::shared_ptr<RemoteCache> cache_;
  std::map<std::string, Bytes> current_;
  std::vector<Handle> handles_;
  uint64_t reads_checked_ = 0, failures_allowed_seen_ = 0;
};

// False once a check failed (the failure names the seed, the step and the operations before it).
bool run_model(uint64_t seed, int steps, bool prefetches) {
  ReadPathModel model(seed, prefetches);
  std::vector<std::string> last;
  for (int i = 0; i < steps; ++i) {
    last.push_back(model.step());
    if (last.size() > 8) last.erase(last.begin());
    if (::testing::Test::HasFailure()) {
      std::string trail;
      for (const auto& s : last) trail += "\n  " + s;
      ADD_FAILURE() << "seed " << seed << ", step " << i << "; the last operations:" << trail;
      return false;
    }
  }
  EXPECT_TRUE(model.store().bad_gets().empty())
      << "a GET outside its object's version: " << model.store().bad_gets().front();
  EXPECT_GT(model.reads_checked(), static_cast<uint64_t>(steps) / 2);
  EXPECT_GT(model.failures_allowed_seen(), 0u) << "no read ever met a replaced object";
  EXPECT_LE(model.cache().figures()["memory_bytes"].get<uint64_t>(), small_cache().remote.memory_bytes);
  return !::testing::Test::HasFailure();
}

TEST(ReadPathModel, RandomOpensReadsPrefetchesAndReplacementsMatchTheModel) {
  for (uint64_t seed = 1; seed <= 4; ++seed)
    if (!run_model(seed, 1500, true)) break;
}

TEST(ReadPathModel, AReadOfWhatWasJustReadFetchesNothing) {
  for (uint64_t seed = 11; seed <= 13; ++seed)
    if (!run_model(seed, 1000, false)) break;
}

}  // namespace
}  // namespace ckptfs::io
