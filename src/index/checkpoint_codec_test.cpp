// The index codec against the parser: a checkpoint decoded from its encoding serves the same tensors,
// byte for byte, as the checkpoint parsed from the sources; damaged encodings are FormatError, never a
// crash or another exception (what the decoder's fuzz target also holds it to).
#include "index/checkpoint_codec.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "ckptfs/error.hpp"

namespace ckptfs::index {
namespace {

namespace fs = std::filesystem;

const fs::path kExamples = fs::path(CKPTFS_SOURCE_DIR) / "examples";

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

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

class RoundTrip : public testing::TestWithParam<const char*> {};

TEST_P(RoundTrip, DecodedServesWhatParsingServes) {
  const Checkpoint parsed = open_checkpoint(kExamples / GetParam());
  const std::string encoded = encode_checkpoint(parsed);
  const Checkpoint decoded = decode_checkpoint(bytes_of(encoded));
  expect_same_tensors(parsed, decoded);
  // Every field the encoder writes came back (sharing included): the decoded checkpoint encodes alike.
  EXPECT_EQ(encode_checkpoint(decoded), encoded);
}

INSTANTIATE_TEST_SUITE_P(Examples, RoundTrip,
                         testing::Values("deepspeed-zero3-bf16", "deepspeed-universal-z2-bf16", "deepspeed-moe-ep2",
                                         "dcp-shard1-ws2", "dcp-hf-storage-ws2", "megatron-tp2-pp2",
                                         "torch-save-file/full_state.pt", "verl-fsdp2-ws2"));

// Decodes `bytes`; true when it gave a checkpoint, false on FormatError; any other exception fails.
bool decodes(const std::string& bytes) {
  try {
    decode_checkpoint(bytes_of(bytes));
    return true;
  } catch (const FormatError&) {
    return false;
  }
}

TEST(DamagedEncoding, EveryTruncationIsAFormatError) {
  const std::string encoded = encode_checkpoint(open_checkpoint(kExamples / "megatron-tp2-pp2"));
  const size_t step = std::max<size_t>(1, encoded.size() / 3000);
  for (size_t n = 0; n < encoded.size(); n += step) EXPECT_FALSE(decodes(encoded.substr(0, n))) << n;
  EXPECT_FALSE(decodes(encoded + '\0'));
}

TEST(DamagedEncoding, FlippedBytesDecodeOrFailCleanly) {
  const std::string encoded = encode_checkpoint(open_checkpoint(kExamples / "deepspeed-universal-z2-bf16"));
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
    const std::string encoded = encode_checkpoint(open_checkpoint(kExamples / example));
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
  const std::string encoded = encode_checkpoint(open_checkpoint(dir));
  fs::last_write_time(dir / "latest", fs::last_write_time(dir / "latest") + std::chrono::seconds(5));
  EXPECT_THROW(decode_checkpoint(bytes_of(encoded)), StaleIndex);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ckptfs::index
