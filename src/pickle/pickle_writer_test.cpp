// PickleWriter: exact bytes against what CPython's pickle.dumps(..., protocol=2) writes, memo numbering,
// dict batching, and a round trip through the project's unpickler.
#include "pickle/pickle_writer.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "ckptfs/pickle.hpp"

namespace ckptfs::pickle {
namespace {

using namespace std::string_literals;

ValuePtr load(const std::string& bytes) {
  return unpickle(std::as_bytes(std::span(bytes)));
}

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
            "\x80\x02(X\x01\x00\x00\x00"
            "aq\x00X\x01\x00\x00\x00"
            "bq\x01X\x01\x00\x00\x00"
            "cq\x02X\x01\x00\x00\x00"
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
            "\x80\x02(ccollections\nOrderedDict\nq\x00X\x03\x00\x00\x00"
            "cpuq\x01X\x03\x00\x00\x00"
            "cpuq\x02h\x01h\x00tq\x03."s);
}

TEST(PickleWriter, DictBatchesRoundTrip) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{1000}, size_t{1001}, size_t{2500}}) {
    PickleWriter w;
    w.empty_dict();
    w.set_items(count, [&](size_t i) {
      w.string("key" + std::to_string(i));
      w.shared_string("value");
    });
    const std::string bytes = std::move(w).finish();
    const auto value = load(bytes);
    ASSERT_EQ(value->kind, Kind::Dict);
    ASSERT_EQ(value->entries.size(), count);
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(value->entries[i].first->text, "key" + std::to_string(i));
      EXPECT_EQ(value->entries[i].second->text, "value");
    }
    // CPython's batches: MARK ... SETITEMS for 2..1000 items, a lone trailing item with SETITEM.
    if (count == 1001) {
      EXPECT_EQ(bytes.substr(bytes.size() - 2), "s.");
    }
    if (count == 2) {
      EXPECT_EQ(bytes.substr(bytes.size() - 2), "u.");
    }
  }
}

TEST(PickleWriter, MemoIndicesPast255UseLongOpcodes) {
  PickleWriter w;
  w.begin_tuple(302);
  for (int i = 0; i < 300; ++i) w.integer(i);  // integers are not memoised
  w.shared_string("x");                        // memo 0
  w.shared_string("x");                        // BINGET 0
  w.end_tuple(302);                            // memo 1
  const std::string first = std::move(w).finish();
  EXPECT_NE(first.find("q\x00h\x00t"s), std::string::npos);

  PickleWriter many;
  many.begin_tuple(258);
  for (int i = 0; i < 256; ++i) many.string("s");  // memo 0..255
  many.shared_string("x");                         // LONG_BINPUT 256
  many.shared_string("x");                         // LONG_BINGET 256
  many.end_tuple(258);
  const std::string bytes = std::move(many).finish();
  EXPECT_NE(bytes.find("xr\x00\x01\x00\x00j\x00\x01\x00\x00tr\x01\x01\x00\x00."s), std::string::npos);
  EXPECT_EQ(load(bytes)->items.size(), 258u);
}

}  // namespace
}  // namespace ckptfs::pickle
