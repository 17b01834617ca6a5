#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "ckptfs/s3_cache.hpp"

namespace ckptfs::s3 {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// An in-process store: objects by key, each with its ETag; GETs pinned to another ETag fail as S3's do (412).
class FakeStore : public RangeReader {
 public:
  struct Get {
    std::string key;
    std::uint64_t offset, length;
  };

  ObjectId put(const std::string& key, const std::string& etag, std::vector<std::byte> bytes) {
    std::lock_guard lock(mutex_);
    ObjectId id{"bucket", key, etag, bytes.size()};
    objects_[key] = {etag, std::move(bytes)};
    return id;
  }
  void read_range(const ObjectId& o, std::uint64_t offset, std::span<std::byte> dst) override {
    int now = ++in_flight_;
    for (int seen = max_in_flight_; now > seen && !max_in_flight_.compare_exchange_weak(seen, now);) {
    }
    std::this_thread::sleep_for(delay);
    --in_flight_;
    std::lock_guard lock(mutex_);
    gets_.push_back({o.key, offset, dst.size()});
    if (failures > 0) {
      --failures;
      throw Error("s3://bucket/" + o.key + ": HTTP 503 ServiceUnavailable", 503, "ServiceUnavailable");
    }
    const auto& [etag, bytes] = objects_.at(o.key);
    if (etag != o.etag)
      throw ObjectChangedError("s3://bucket/" + o.key + ": HTTP 412", 412, "PreconditionFailed");
    ASSERT_LE(offset + dst.size(), bytes.size());
    std::memcpy(dst.data(), bytes.data() + offset, dst.size());
  }
  std::uint64_t retries() const override { return 7; }

  std::vector<Get> gets() const {
    std::lock_guard lock(mutex_);
    return gets_;
  }
  std::uint64_t bytes_got() const {
    std::uint64_t n = 0;
    for (const Get& g : gets()) n += g.length;
    return n;
  }
  int max_in_flight() const { return max_in_flight_; }

  std::chrono::milliseconds delay{0};
  int failures = 0;  // the next GETs that fail with 503 (set before reading)

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::pair<std::string, std::vector<std::byte>>> objects_;
  std::vector<Get> gets_;
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
};

// Small sizes so that tests cross many blocks: 64 KiB blocks, 4 KiB alignment, 1 MiB of memory.
BlockCacheOptions small_options() {
  BlockCacheOptions o;
  o.memory_bytes = 1 << 20;
  o.block_bytes = 64 << 10;
  o.align_bytes = 4 << 10;
  o.connections = 4;
  return o;
}

std::vector<std::byte> read(BlockCache& cache, const ObjectId& id, std::uint64_t offset,
                            std::uint64_t length) {
  std::vector<std::byte> out(length);
  cache.read(id, offset, out);
  return out;
}

std::vector<std::byte> slice(const std::vector<std::byte>& v, std::uint64_t offset, std::uint64_t length) {
  return {v.begin() + offset, v.begin() + offset + length};
}

template <class Pred>
bool eventually(Pred pred) {
  for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

struct BlockCacheTest : ::testing::Test {
  std::shared_ptr<FakeStore> store = std::make_shared<FakeStore>();
  std::vector<std::byte> bytes = random_bytes((1 << 20) + 12345, 1);  // 16 blocks and a short one
  ObjectId id = store->put("ckpt/shard.pt", "\"etag-1\"", bytes);
};

TEST_F(BlockCacheTest, ReadsAreByteExactAcrossBlockBoundaries) {
  BlockCache cache(store, small_options());
  std::mt19937_64 rng(2);
  for (int i = 0; i < 300; ++i) {
    std::uint64_t offset = rng() % bytes.size(),
                  length = rng() % std::min<std::uint64_t>(300000, bytes.size() - offset);
    ASSERT_EQ(read(cache, id, offset, length), slice(bytes, offset, length)) << offset << "+" << length;
  }
  EXPECT_EQ(read(cache, id, 0, bytes.size()), bytes);
  EXPECT_EQ(read(cache, id, bytes.size() - 1, 1), slice(bytes, bytes.size() - 1, 1));  // the short last block
  EXPECT_TRUE(read(cache, id, bytes.size(), 0).empty());
  for (const auto& g : store->gets()) {
    EXPECT_LE(g.length, 64u << 10);
    EXPECT_EQ(g.offset / (64 << 10), (g.offset + g.length - 1) / (64 << 10))
        << "a GET crossed a block boundary";
  }
  EXPECT_LE(cache.stats().memory_bytes, 1u << 20);
}

TEST_F(BlockCacheTest, ReadPastTheEndIsAnError) {
  BlockCache cache(store, small_options());
  std::vector<std::byte> out(10);
  EXPECT_THROW(cache.read(id, bytes.size() - 5, out), SourceError);
  EXPECT_TRUE(store->gets().empty());
}

TEST_F(BlockCacheTest, ConcurrentReadersOfOneRangeShareOneGet) {
  store->delay = 50ms;
  BlockCache cache(store, small_options());
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 32; ++t)
    readers.emplace_back([&] {
      if (read(cache, id, 1000, 20000) != slice(bytes, 1000, 20000)) ++wrong;
    });
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong, 0);
  ASSERT_EQ(store->gets().size(), 1u);
  EXPECT_EQ(store->gets()[0].offset, 0u);
  EXPECT_EQ(store->gets()[0].length, 24u << 10);  // [1000, 21000) rounded out to 4 KiB
  EXPECT_EQ(cache.stats().misses + cache.stats().hits, 32u);
}

TEST_F(BlockCacheTest, ManyReadersFetchEachByteOnce) {
  store->delay = 2ms;
  BlockCacheOptions o = small_options();
  o.memory_bytes = 4 << 20;  // the whole object fits: nothing is evicted
  BlockCache cache(store, o);
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 16; ++t)
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 40; ++i) {
        std::uint64_t offset = rng() % (900 << 10), length = 1 + rng() % (100 << 10);
        if (read(cache, id, offset, length) != slice(bytes, offset, length)) ++wrong;
      }
    });
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong, 0);
  // Nothing was evicted, so no byte was fetched twice.
  std::vector<int> fetched(bytes.size(), 0);
  for (const auto& g : store->gets())
    for (std::uint64_t i = g.offset; i < g.offset + g.length; ++i) ASSERT_EQ(++fetched[i], 1) << "byte " << i;
}

TEST_F(BlockCacheTest, GetsRunInParallelUpToTheConnectionBound) {
  store->delay = 20ms;
  BlockCacheOptions o = small_options();
  o.connections = 3;
  BlockCache cache(store, o);
  EXPECT_EQ(read(cache, id, 0, 16 * (64 << 10)), slice(bytes, 0, 16 * (64 << 10)));
  EXPECT_EQ(store->gets().size(), 16u);  // one GET per block
  EXPECT_EQ(store->max_in_flight(), 3);
}

TEST_F(BlockCacheTest, MemoryStaysBoundedOverAScanTenTimesTheCache) {
  auto big = random_bytes(10 << 20, 3);
  ObjectId big_id = store->put("big", "\"b\"", big);
  BlockCache cache(store, small_options());
  for (std::uint64_t at = 0; at < big.size(); at += 48 << 10) {
    std::uint64_t n = std::min<std::uint64_t>(48 << 10, big.size() - at);
    ASSERT_EQ(read(cache, big_id, at, n), slice(big, at, n));
    ASSERT_LE(cache.stats().memory_bytes, 1u << 20);
  }
  // A sequential reader fetches whole blocks (after its first read), one ahead, and each byte once.
  EXPECT_EQ(store->bytes_got(), big.size());
  EXPECT_LE(store->gets().size(), big.size() / (64 << 10) + 2);
  EXPECT_GT(cache.stats().hits, cache.stats().misses);  // the blocks read ahead
}

TEST_F(BlockCacheTest, ARandomReaderFetchesOnlyWhatItReads) {
  BlockCache cache(store, small_options());
  for (std::uint64_t at : {900000u, 10000u, 500000u, 300000u})  // not one after the other
    EXPECT_EQ(read(cache, id, at, 100), slice(bytes, at, 100));
  EXPECT_LE(store->bytes_got(), 4u * 2 * (4 << 10));  // each 100 bytes: one or two 4 KiB units
}

TEST_F(BlockCacheTest, AReplacedObjectIsFetchedAgainAndTheOldVersionFails) {
  BlockCache cache(store, small_options());
  EXPECT_EQ(read(cache, id, 0, 5000), slice(bytes, 0, 5000));
  auto replaced = random_bytes(bytes.size(), 4);
  ObjectId new_id = store->put(id.key, "\"etag-2\"", replaced);
  EXPECT_EQ(read(cache, new_id, 0, 5000), slice(replaced, 0, 5000));  // same range, new ETag: fetched again
  EXPECT_EQ(store->gets().size(), 2u);
  std::vector<std::byte> out(100);
  EXPECT_THROW(cache.read(id, 700000, out), ObjectChangedError);  // the old version's uncached bytes
}

TEST_F(BlockCacheTest, AFailureIsNotCachedAndReachesEveryWaiter) {
  store->delay = 30ms;
  store->failures = 1;
  BlockCache cache(store, small_options());
  std::atomic<int> failed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 8; ++t)
    readers.emplace_back([&] {
      try {
        read(cache, id, 0, 1000);
      } catch (const Error& e) {
        if (e.code() == "ServiceUnavailable") ++failed;
      }
    });
  for (auto& t : readers) t.join();
  EXPECT_GE(failed, 1);
  EXPECT_EQ(read(cache, id, 0, 1000), slice(bytes, 0, 1000));  // the store is back: fetched again
  EXPECT_EQ(cache.stats().memory_bytes, 4u << 10);
}

TEST_F(BlockCacheTest, AFailureInOnePartFailsTheReadAfterTheOtherPartsFinish) {
  store->failures = 1;
  BlockCache cache(store, small_options());
  std::vector<std::byte> out(200 << 10);
  EXPECT_THROW(cache.read(id, 0, out), Error);
  EXPECT_EQ(read(cache, id, 0, 200 << 10), slice(bytes, 0, 200 << 10));
}

TEST_F(BlockCacheTest, PrefetchedBytesAreReadWithoutAnotherGet) {
  BlockCache cache(store, small_options());
  cache.prefetch(id, 10000, 200000);
  ASSERT_TRUE(eventually([&] { return store->bytes_got() >= 200000; }));
  const auto gets = store->gets().size();
  for (std::uint64_t at = 10000; at < 210000; at += 50000)
    EXPECT_EQ(read(cache, id, at, 50000), slice(bytes, at, 50000));
  EXPECT_EQ(store->gets().size(), gets);
  EXPECT_EQ(cache.stats().misses, 0u);
  EXPECT_GE(cache.stats().hits, 4u);
  // No over-fetch at the ends of the prefetched range: only the rounding to 4 KiB.
  EXPECT_EQ(store->bytes_got(), 212992u - 8192u);  // [8192, 212992): 10000 and 210000 rounded out
}

TEST_F(BlockCacheTest, APrefetchIsCutIntoEqualGetsNotAtBlockMultiples) {
  BlockCache cache(store, small_options());
  cache.prefetch(id, 40000,
                 100000);  // [36864, 143360) rounded out: two GETs, where cuts at 64 KiB made three
  ASSERT_TRUE(eventually([&] { return store->bytes_got() == 106496u; }));
  const auto gets = store->gets();
  ASSERT_EQ(gets.size(), 2u);
  for (const auto& g : gets) EXPECT_EQ(g.length, 53248u);
  EXPECT_EQ(read(cache, id, 40000, 100000), slice(bytes, 40000, 100000));
  EXPECT_EQ(store->gets().size(), 2u);
}

TEST_F(BlockCacheTest, SmallExtentsOutliveAScanOfLargeOnes) {
  auto big = random_bytes(10 << 20, 6);
  ObjectId big_id = store->put("big", "\"b\"", big);
  BlockCache cache(store, small_options());
  EXPECT_EQ(read(cache, id, 300000, 64), slice(bytes, 300000, 64));  // one 4 KiB extent
  for (std::uint64_t at = 0; at < big.size(); at += 100000)          // ten times the memory in large extents
    ASSERT_EQ(read(cache, big_id, at, std::min<std::uint64_t>(100000, big.size() - at)),
              slice(big, at, std::min<std::uint64_t>(100000, big.size() - at)));
  const auto gets = store->gets().size();
  EXPECT_EQ(read(cache, id, 300000, 64), slice(bytes, 300000, 64));
  EXPECT_EQ(store->gets().size(), gets);
  // Beyond their share (a 32nd of the memory) small extents go too: memory stays bounded.
  for (std::uint64_t at = 0; at < bytes.size() - 64; at += 8192) read(cache, id, at, 64);
  for (std::uint64_t at = 0; at < big.size(); at += 100000) read(cache, big_id, at, 64);
  EXPECT_LE(cache.stats().memory_bytes, 1u << 20);
}

TEST_F(BlockCacheTest, ACachedReadFetchesNothing) {
  BlockCache cache(store, small_options());
  std::vector<std::byte> out(1000, std::byte{0x5a});
  EXPECT_FALSE(cache.read(id, 5000, out, BlockCache::ReadKind::cached));
  EXPECT_EQ(out, std::vector<std::byte>(1000, std::byte{0x5a}));
  EXPECT_TRUE(store->gets().empty());
  cache.prefetch(id, 4096, 8192);
  EXPECT_TRUE(cache.read(id, 5000, out, BlockCache::ReadKind::cached));  // there, or on its way
  EXPECT_EQ(out, slice(bytes, 5000, 1000));
  EXPECT_FALSE(cache.read(id, 12000, out, BlockCache::ReadKind::cached));  // partly past the prefetch
  EXPECT_EQ(store->gets().size(), 1u);
}

TEST_F(BlockCacheTest, APrefetchHoldsAtMostThreeQuartersOfTheMemory) {
  auto big = random_bytes(10 << 20, 5);
  ObjectId big_id = store->put("big", "\"b\"", big);
  BlockCache cache(store, small_options());
  cache.prefetch(big_id, 0, big.size());
  ASSERT_TRUE(eventually([&] { return cache.stats().requests == 12; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(store->bytes_got(), 768u << 10);
  // Reading them frees the share: the next prefetch goes on.
  EXPECT_EQ(read(cache, big_id, 0, 768 << 10), slice(big, 0, 768 << 10));
  cache.prefetch(big_id, 768 << 10, big.size());
  ASSERT_TRUE(eventually([&] { return store->bytes_got() == 1536u << 10; }));
}

// A ZeRO-3 view read through a small cache (-o cache_mb=8) over 64 rank objects: a 4 MiB window (two thirds
// of the prefetch share) hands each object 64 KiB ahead in steps of 16 KiB, the reader takes 16 KiB of each
// object in turn. Each object holds an extent half read while the next ones arrive: were an extent to leave
// the prefetch share at its first read, prefetches would evict the rest of it, fetched again later.
TEST(BlockCacheManyObjects, ASmallCacheFetchesEachByteAboutOnce) {
  auto store = std::make_shared<FakeStore>();
  constexpr int kObjects = 64;
  constexpr std::uint64_t kSize = 1536 << 10, kWindow = 64 << 10, kStep = 16 << 10, kSlice = 16 << 10;
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < kObjects; ++i) {
    data.push_back(random_bytes(kSize, 100 + i));
    ids.push_back(store->put(fmt::format("rank{}", i), "\"e\"", data.back()));
  }
  BlockCacheOptions o;
  o.memory_bytes = 8 << 20;
  BlockCache cache(store, o);
  std::uint64_t prefetched_to = 0;
  for (std::uint64_t at = 0; at < kSize; at += kSlice) {
    if (const std::uint64_t to = std::min(kSize, at + kWindow); to - prefetched_to >= kStep || to == kSize) {
      for (const ObjectId& id : ids) cache.prefetch(id, prefetched_to, to - prefetched_to);
      prefetched_to = to;
    }
    for (int i = 0; i < kObjects; ++i) ASSERT_EQ(read(cache, ids[i], at, kSlice), slice(data[i], at, kSlice));
  }
  EXPECT_LE(store->bytes_got(), kObjects * kSize * 110 / 100);
  EXPECT_LE(cache.stats().memory_bytes, o.memory_bytes);
}

TEST_F(BlockCacheTest, ReadsOfAPrefetchedObjectFetchNoMoreThanTheyAsk) {
  BlockCache cache(store, small_options());
  cache.prefetch(id, 0, 100);
  for (std::uint64_t at = 100000; at < 200000; at += 20000)  // sequential, but the caller prefetches
    EXPECT_EQ(read(cache, id, at, 20000), slice(bytes, at, 20000));
  // the prefetched block, read last, waits for the prefetch's GET (under load it can still be in flight)
  EXPECT_EQ(read(cache, id, 0, 100), slice(bytes, 0, 100));
  EXPECT_EQ(store->bytes_got(), 4096u + (200704u - 98304u));  // [0, 4096) and [100000, 200000) rounded out
}

TEST_F(BlockCacheTest, AReaderOfAQueuedPrefetchGoesFirst) {
  store->delay = 30ms;
  BlockCacheOptions o = small_options();
  o.connections = 1;
  o.memory_bytes = 64 << 20;
  BlockCache cache(store, o);
  cache.prefetch(id, 0, bytes.size());  // 17 GETs one after the other: 510 ms
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(read(cache, id, bytes.size() - 100, 100), slice(bytes, bytes.size() - 100, 100));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 300ms);  // the GET in flight, then this one
}

TEST_F(BlockCacheTest, TheDestructorDoesNotWaitForQueuedPrefetches) {
  store->delay = 50ms;
  auto start = std::chrono::steady_clock::now();
  {
    BlockCacheOptions o = small_options();
    o.connections = 2;
    o.memory_bytes = 64 << 20;
    BlockCache cache(store, o);
    cache.prefetch(id, 0, bytes.size());  // 17 GETs, 2 at a time
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 400ms);
}

TEST(BlockCacheOptions, TheDefaultMemoryIsASixteenthOfTheMachinesFrom256MiBTo1GiB) {
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  std::uint64_t kib = 0;
  while (meminfo >> name >> kib && name != "MemTotal:") meminfo.ignore(1 << 10, '\n');
  ASSERT_EQ(name, "MemTotal:");
  const std::uint64_t sixteenth = kib * 1024 / 16, step = 64ull << 20;
  EXPECT_EQ(BlockCacheOptions{}.memory_bytes,
            std::clamp<std::uint64_t>(sixteenth / step * step, 256ull << 20, 1ull << 30));
}

TEST_F(BlockCacheTest, StatsCountWhatHappened) {
  BlockCache cache(store, small_options());
  read(cache, id, 0, 100);
  read(cache, id, 0, 100);
  auto s = cache.stats();
  EXPECT_EQ(s.requests, 1u);
  EXPECT_EQ(s.bytes_fetched, 4096u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.retries, 7u);  // the reader's own counter
  EXPECT_EQ(s.disk_hits, 0u);
  ObjectId other = store->put("other", "\"o\"", random_bytes(10000, 9));
  read(cache, other, 0, 10000);
  auto per_object = cache.object_stats();
  std::sort(per_object.begin(), per_object.end(), [](auto& a, auto& b) { return a.key < b.key; });
  ASSERT_EQ(per_object.size(), 2u);
  EXPECT_EQ(per_object[0].key, id.key);
  EXPECT_EQ(per_object[0].etag, id.etag);
  EXPECT_EQ(per_object[0].bytes_fetched, 4096u);
  EXPECT_EQ(per_object[1].key, "other");
  EXPECT_EQ(per_object[1].bytes_fetched, 10000u);
  EXPECT_EQ(per_object[1].requests, 1u);
}

struct DiskCacheTest : BlockCacheTest {
  fs::path dir =
      fs::temp_directory_path() / ("ckptfs-cache-test-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  BlockCacheOptions options() {
    BlockCacheOptions o = small_options();
    o.memory_bytes = 4 << 20;  // the whole object fits (a read larger than memory is not cached)
    o.dir = dir;
    return o;
  }
  void TearDown() override { fs::remove_all(dir); }
  std::vector<fs::path> files() {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
    return out;
  }
  void wait_for_files(std::size_t n) {
    ASSERT_TRUE(eventually([&] { return files().size() >= n; })) << files().size();
  }
};

TEST_F(DiskCacheTest, ASecondCacheReadsWhatTheFirstFetched) {
  {
    BlockCache first(store, options());
    EXPECT_EQ(read(first, id, 0, bytes.size()), bytes);
  }
  EXPECT_EQ(files().size(), 17u);
  const auto gets = store->gets().size();
  BlockCache second(store, options());
  EXPECT_EQ(read(second, id, 0, bytes.size()), bytes);
  EXPECT_EQ(read(second, id, 70000, 1000), slice(bytes, 70000, 1000));
  EXPECT_EQ(store->gets().size(), gets);
  EXPECT_EQ(second.stats().disk_hits, 17u);
  EXPECT_EQ(second.stats().requests, 0u);
}

TEST_F(DiskCacheTest, AFileOfAnOldEtagIsNeverRead) {
  {
    BlockCache first(store, options());
    read(first, id, 0, 1000);
    wait_for_files(1);
  }
  auto replaced = random_bytes(bytes.size(), 6);
  ObjectId new_id = store->put(id.key, "\"etag-2\"", replaced);
  BlockCache second(store, options());
  EXPECT_EQ(read(second, new_id, 0, 1000), slice(replaced, 0, 1000));
  EXPECT_EQ(second.stats().disk_hits, 0u);
  EXPECT_EQ(second.stats().requests, 1u);
}

TEST_F(DiskCacheTest, ACorruptOrShortFileIsRefetched) {
  {
    BlockCache first(store, options());
    read(first, id, 0, 200 << 10);  // 4 files of one block
    wait_for_files(4);
  }
  auto all = files();
  std::sort(all.begin(), all.end());
  {
    std::fstream f(all[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x5a' ^ static_cast<char>(f.peek()));
  }
  fs::resize_file(all[1], fs::file_size(all[1]) - 1);
  BlockCache second(store, options());
  EXPECT_EQ(read(second, id, 0, 200 << 10), slice(bytes, 0, 200 << 10));
  EXPECT_EQ(second.stats().disk_hits, 2u);
  EXPECT_EQ(second.stats().requests, 2u);
}

TEST_F(DiskCacheTest, TheDirectoryStaysUnderItsBound) {
  BlockCacheOptions o = options();
  o.dir_bytes = 300 << 10;
  {
    BlockCache cache(store, o);
    read(cache, id, 0, bytes.size());
  }
  std::uint64_t total = 0;
  for (const auto& f : files()) total += fs::file_size(f);
  EXPECT_LE(total, 300u << 10);
  EXPECT_GT(total, 200u << 10);
  BlockCache again(store, o);  // the most recent blocks are the ones kept
  EXPECT_EQ(read(again, id, bytes.size() - 1000, 1000), slice(bytes, bytes.size() - 1000, 1000));
  EXPECT_EQ(again.stats().requests, 0u);
}

TEST_F(DiskCacheTest, AnUnwritableDirectoryIsAUsageError) {
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  BlockCacheOptions o = options();
  o.dir = dir / "file" / "sub";
  try {
    BlockCache cache(store, o);
    FAIL() << "no error";
  } catch (const ckptfs::Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage);
    EXPECT_NE(std::string(e.what()).find("file/sub"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ckptfs::s3
