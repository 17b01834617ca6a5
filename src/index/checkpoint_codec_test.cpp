// The index codec against the parser: a checkpoint decoded from its encoding is the checkpoint parsed from
// the sources, field by field, and serves the same tensors, byte for byte; damaged encodings are
// FormatError, never a crash or another exception (what the decoder's fuzz target also holds it to).
#include "index/checkpoint_codec.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <utility>

#include "ckptfs/error.hpp"
#include "index/checkpoint_fields.hpp"
#include "io/test_source.hpp"

namespace ckptfs::index {
namespace {

namespace fs = std::filesystem;

const fs::path kExamples = fs::path(CKPTFS_SOURCE_DIR) / "examples";

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

std::vector<std::byte> tensor_bytes(const catalog::LogicalTensor& t) {
  std::vector<std::byte> out(t.nbytes());
  catalog::read_tensor(t, 0, out);
  return out;
}

void expect_same_tensors(const Checkpoint& parsed, const Checkpoint& decoded) {
  ASSERT_EQ(parsed.tags.size(), decoded.tags.size());
  EXPECT_EQ(parsed.latest, decoded.latest);
  for (size_t i = 0; i < parsed.tags.size(); ++i) {
    const Tag& a = parsed.tags[i];
    const Tag& b = decoded.tags[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.files, b.files);
    const auto named = a.named_catalogs();
    const auto other_named = b.named_catalogs();
    ASSERT_EQ(named.size(), other_named.size());
    for (size_t n = 0; n < named.size(); ++n) {
      const auto& [role, catalog] = named[n];
      ASSERT_EQ(role, other_named[n].first);
      const auto& other = other_named[n].second->tensors;
      ASSERT_EQ(catalog->tensors.size(), other.size()) << role;
      for (size_t k = 0; k < other.size(); ++k) {
        EXPECT_EQ(catalog->tensors[k].name, other[k].name);
        EXPECT_EQ(catalog->tensors[k].shape, other[k].shape);
        EXPECT_EQ(tensor_bytes(catalog->tensors[k]), tensor_bytes(other[k])) << role << " " << other[k].name;
      }
    }
    ASSERT_EQ(a.deepspeed.has_value(), b.deepspeed.has_value());
    if (a.deepspeed) {
      EXPECT_EQ(a.deepspeed->zero_stage, b.deepspeed->zero_stage);
    }
    ASSERT_EQ(a.universal() != nullptr, b.universal() != nullptr);
    if (a.universal()) {
      EXPECT_EQ(a.universal()->params.size(), b.universal()->params.size());
    }
    EXPECT_EQ(a.state_files.size(), b.state_files.size());
  }
}

// The first field where two values differ, walked by the codec's own field lists (each of which names
// every member of its struct: field_codec.hpp checks it): its path from the root ("" when they are
// equal), `/k` the k-th field of a struct, `[i]` an item. A shared object is compared by what it points to
// (a wired one by its wire value: a file by its path, identity and origin), once per pair of objects.
class FirstDifference {
 public:
  template <class T>
  std::string operator()(const T& a, const T& b, const std::string& at) {
    using namespace codec_detail;
    if constexpr (std::is_same_v<T, double>) {
      return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b) ? "" : at;  // NaN equals itself
    } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string> ||
                         std::is_same_v<T, fs::path>) {
      return a == b ? "" : at;
    } else if constexpr (kIs<T, std::vector> || kIs<T, std::map>) {
      if (a.size() != b.size()) return at + ".size()";
      size_t i = 0;
      for (auto x = a.begin(), y = b.begin(); x != a.end(); ++x, ++y, ++i)
        if (auto d = (*this)(*x, *y, at + "[" + std::to_string(i) + "]"); !d.empty()) return d;
      return "";
    } else if constexpr (kIs<T, std::pair>) {
      auto d = (*this)(a.first, b.first, at + ".first");
      return d.empty() ? (*this)(a.second, b.second, at + ".second") : d;
    } else if constexpr (kIs<T, std::optional>) {
      if (a.has_value() != b.has_value()) return at + ".has_value()";
      return a ? (*this)(*a, *b, at) : "";
    } else if constexpr (kIs<T, std::variant>) {
      if (a.index() != b.index()) return at + ".index()";
      return std::visit([&](const auto& x) { return (*this)(x, std::get<std::decay_t<decltype(x)>>(b), at); },
                        a);
    } else if constexpr (kIs<T, std::shared_ptr>) {
      if (!a || !b) return (a == nullptr) == (b == nullptr) ? "" : at + " (null)";
      if (!compared_.emplace(a.get(), b.get()).second) return "";
      using U = std::remove_const_t<typename T::element_type>;
      if constexpr (Wired<U>)
        return (*this)(Wire<U>::to(*a), Wire<U>::to(*b), at + "->");
      else
        return (*this)(*a, *b, at + "->");
    } else if constexpr (kMadeAgain<T>) {
      return "";
    } else {
      return fields(Fields<T>::of(a), Fields<T>::of(b), at,
                    std::make_index_sequence<std::tuple_size_v<decltype(Fields<T>::of(a))>>());
    }
  }

 private:
  template <class Tuple, size_t... I>
  std::string fields(const Tuple& a, const Tuple& b, const std::string& at, std::index_sequence<I...>) {
    std::string d;
    ((d = d.empty() ? (*this)(std::get<I>(a), std::get<I>(b), at + "/" + std::to_string(I)) : d), ...);
    return d;
  }

  std::set<std::pair<const void*, const void*>> compared_;
};

class RoundTrip : public testing::TestWithParam<const char*> {};

TEST_P(RoundTrip, DecodedIsParsedFieldByField) {
  const Checkpoint parsed = open_checkpoint(*io::test_source(kExamples / GetParam()));
  const Checkpoint decoded =
      decode_checkpoint(bytes_of(encode_checkpoint(*io::test_source("/"), parsed)), io::test_source("/"));
  EXPECT_EQ(FirstDifference()(parsed, decoded, "checkpoint"), "");
}

// The comparison is not vacuous: a member changed after decoding is found, and named by its path.
TEST(FirstDifference, NamesAChangedMember) {
  const Checkpoint parsed = open_checkpoint(*io::test_source(kExamples / "deepspeed-zero3-bf16"));
  Checkpoint changed =
      decode_checkpoint(bytes_of(encode_checkpoint(*io::test_source("/"), parsed)), io::test_source("/"));
  changed.tags.back().topology.dp += 1;
  const std::string tag = std::to_string(changed.tags.size() - 1);
  EXPECT_EQ(FirstDifference()(parsed, changed, "checkpoint"),
            "checkpoint/3[" + tag + "]/3/0");  // tags, topology, dp
}

TEST_P(RoundTrip, DecodedServesWhatParsingServes) {
  const Checkpoint parsed = open_checkpoint(*io::test_source(kExamples / GetParam()));
  const std::string encoded = encode_checkpoint(*io::test_source("/"), parsed);
  const Checkpoint decoded = decode_checkpoint(bytes_of(encoded), io::test_source("/"));
  expect_same_tensors(parsed, decoded);
  // Every field the encoder writes came back (sharing included): the decoded checkpoint encodes alike.
  EXPECT_EQ(encode_checkpoint(*io::test_source("/"), decoded), encoded);
}

INSTANTIATE_TEST_SUITE_P(Examples, RoundTrip,
                         testing::Values("deepspeed-zero3-bf16", "deepspeed-universal-z2-bf16",
                                         "deepspeed-moe-ep2", "dcp-shard1-ws2", "dcp-hf-storage-ws2",
                                         "megatron-tp2-pp2", "torch-save-file/full_state.pt",
                                         "verl-fsdp2-ws2"));

// Decodes `bytes`; true when it gave a checkpoint, false on FormatError; any other exception fails.
bool decodes(const std::string& bytes) {
  try {
    decode_checkpoint(bytes_of(bytes), io::test_source("/"));
    return true;
  } catch (const FormatError&) {
    return false;
  }
}

TEST(DamagedEncoding, EveryTruncationIsAFormatError) {
  const std::string encoded = encode_checkpoint(
      *io::test_source("/"), open_checkpoint(*io::test_source(kExamples / "megatron-tp2-pp2")));
  const size_t step = std::max<size_t>(1, encoded.size() / 3000);
  for (size_t n = 0; n < encoded.size(); n += step) EXPECT_FALSE(decodes(encoded.substr(0, n))) << n;
  EXPECT_FALSE(decodes(encoded + '\0'));
}

TEST(DamagedEncoding, FlippedBytesDecodeOrFailCleanly) {
  const std::string encoded = encode_checkpoint(
      *io::test_source("/"), open_checkpoint(*io::test_source(kExamples / "deepspeed-universal-z2-bf16")));
  const size_t step = std::max<size_t>(1, encoded.size() / 2000);
  int refused = 0;
  for (size_t at = 0; at < encoded.size(); at += step) {
    for (const unsigned char mask : {0x01, 0x80, 0xff}) {
      std::string damaged = encoded;
      damaged[at] = static_cast<char>(damaged[at] ^ mask);
      refused += decodes(damaged) ? 0 : 1;
    }
  }
  EXPECT_GT(refused, 0);
}

// What the fuzz target does, seeded: bytes replaced, cut out and inserted (a null where a reader
// dereferences, a variant turned into another form, a count or number changed) decode or fail cleanly.
TEST(DamagedEncoding, MutatedEncodingsDecodeOrFailCleanly) {
  for (const char* example : {"dcp-shard1-ws2", "verl-fsdp2-ws2"}) {
    const std::string encoded =
        encode_checkpoint(*io::test_source("/"), open_checkpoint(*io::test_source(kExamples / example)));
    std::mt19937 rng(11);
    for (int round = 0; round < 4000; ++round) {
      std::string damaged = encoded;
      for (int k = 1 + static_cast<int>(rng() % 8); k > 0 && !damaged.empty(); --k) {
        const size_t at = rng() % damaged.size();
        switch (rng() % 3) {
          case 0:
            damaged[at] = static_cast<char>(rng());
            break;
          case 1:
            damaged.erase(at, rng() % 16);
            break;
          default:
            damaged.insert(at, std::string(1 + rng() % 4, static_cast<char>(rng())));
        }
      }
      decodes(damaged);  // a crash or another exception fails the test
    }
  }
}

TEST(DamagedEncoding, AChangedSourceIsStale) {
  const fs::path dir = fs::path(testing::TempDir()) / "codec-stale";
  fs::remove_all(dir);
  fs::copy(kExamples / "deepspeed-zero3-bf16", dir, fs::copy_options::recursive);
  const std::string encoded =
      encode_checkpoint(*io::test_source("/"), open_checkpoint(*io::test_source(dir)));
  fs::last_write_time(dir / "latest", fs::last_write_time(dir / "latest") + std::chrono::seconds(5));
  EXPECT_THROW(decode_checkpoint(bytes_of(encoded), io::test_source("/")), StaleIndex);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ckptfs::index
