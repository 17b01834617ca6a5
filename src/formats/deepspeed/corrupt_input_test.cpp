// Robustness: the real DeepSpeed checkpoints, corrupted in a few thousand deterministic ways (bytes flipped
// in the zip end records, central directory, local headers and data.pkl; size and offset fields set to
// huge values; truncation; files copied over others or added under another rank), opened and, when that
// succeeds, read through every view. The only acceptable outcomes are success or a ckptfs::Error whose
// message starts with the path of the file (or directory) at fault: no other exception type, no crash,
// no hang, no runaway memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/layout.hpp"
#include "io/test_source.hpp"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(CKPTFS_SOURCE_DIR) / "mount_tests/fixtures/deepspeed-real";
const fs::path kFixtures019 = fs::path(CKPTFS_SOURCE_DIR) / "mount_tests/fixtures/deepspeed-0.19-real";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint32_t u32_at(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}

void put_le(std::string& b, size_t at, uint64_t value, size_t width) {
  for (size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = static_cast<char>(value >> (8 * i));
}

// Where the interesting parts of one torch.save zip are, found by signature scan.
struct ZipMap {
  std::vector<size_t> local, central, end;  // local headers, central entries, end records (all kinds)
  size_t pickle_begin = 0, pickle_end = 0;  // data.pkl's bytes
};

ZipMap map_zip(const std::string& b) {
  ZipMap m;
  for (size_t i = 0; i + 4 <= b.size(); ++i) {
    if (b[i] != 'P' || b[i + 1] != 'K') continue;
    const uint32_t sig = u32_at(b, i);
    if (sig == 0x04034b50) m.local.push_back(i);
    if (sig == 0x02014b50) m.central.push_back(i);
    if (sig == 0x06054b50 || sig == 0x06064b50 || sig == 0x07064b50) m.end.push_back(i);
  }
  for (size_t i = 0; i < m.local.size(); ++i) {
    const size_t at = m.local[i];
    if (at + 30 > b.size()) continue;
    const size_t name_len = static_cast<uint8_t>(b[at + 26]) | static_cast<uint8_t>(b[at + 27]) << 8;
    const size_t extra_len = static_cast<uint8_t>(b[at + 28]) | static_cast<uint8_t>(b[at + 29]) << 8;
    if (at + 30 + name_len > b.size()) continue;
    const std::string name = b.substr(at + 30, name_len);
    if (name.ends_with("/data.pkl")) {
      m.pickle_begin = at + 30 + name_len + extra_len;
      m.pickle_end = i + 1 < m.local.size() ? m.local[i + 1]
                     : m.central.empty()    ? b.size()
                                            : m.central.front();
    }
  }
  return m;
}

struct Source {
  std::string name;
  std::string bytes;
  ZipMap zip;
};

// Reads every byte of every view (in odd-sized chunks, so reads straddle extents).
void read_views(const io::Source& source, const Checkpoint& cp) {
  std::vector<std::byte> buffer(300007);
  for (const auto& tag : cp.tags) {
    for (const auto& view : tag_views(source, tag)) {
      const uint64_t size = view.file->size();
      for (uint64_t at = 0; at < size;) {
        const uint64_t n = std::min<uint64_t>(buffer.size(), size - at);
        view.file->read(at, std::span(buffer).first(n));
        at += n;
      }
    }
  }
}

class Corrupter {
 public:
  Corrupter(const fs::path& fixture_tag, const fs::path& work, uint32_t seed) : work_(work), rng_(seed) {
    fs::create_directories(work_);
    for (const auto& entry : fs::directory_iterator(fixture_tag)) {
      Source s{entry.path().filename().string(), read_file(entry.path()), {}};
      s.zip = map_zip(s.bytes);
      write_file(work_ / s.name, s.bytes);
      sources_.push_back(std::move(s));
    }
    std::sort(sources_.begin(), sources_.end(),
              [](const Source& a, const Source& b) { return a.name < b.name; });
  }

  // True when the work dir no longer holds exactly the fixture's files and bytes.
  bool changed() const {
    if (!extra_files_.empty()) return true;
    for (const auto& src : sources_)
      if (read_file(work_ / src.name) != src.bytes) return true;
    return false;
  }

  // Applies one mutation; returns its description.
  std::string mutate() {
    Source& s = sources_[pick(sources_.size())];
    std::string b = s.bytes;
    std::string what;
    const int kind = static_cast<int>(pick(9));
    switch (kind) {
      case 0:
        what = flip_in(b, region_of(s.zip.central, b.size(), s.zip), "central directory");
        break;
      case 1:
        what = flip_in(b, local_header(s.zip, b.size()), "local header");
        break;
      case 2:
        what = flip_in(b, {s.zip.pickle_begin, s.zip.pickle_end}, "data.pkl");
        break;
      case 3:
        what = flip_in(b, end_records(s.zip, b.size()), "end records");
        break;
      case 4: {
        const size_t at = pick(2) ? pick(b.size() + 1) : b.size() - std::min(b.size(), pick(512));
        b.resize(at);
        what = fmt("truncated at {}", at);
        break;
      }
      case 5:
        what = huge_field(b, s.zip);
        break;
      case 6:
        what = pickle_opcode(b, s.zip);
        break;
      case 7:
        what = flip_in(b, {0, b.size()}, "anywhere");
        break;
      case 8:
        return duplicate(s);
    }
    write_file(work_ / s.name, b);
    restore_ = &s;
    return s.name + ": " + what;
  }

  void restore() {
    if (restore_) write_file(work_ / restore_->name, restore_->bytes);
    restore_ = nullptr;
    for (const auto& extra : extra_files_) fs::remove(extra);
    extra_files_.clear();
  }

 private:
  struct Range {
    size_t begin, end;
  };

  size_t pick(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  template <typename... Args>
  static std::string fmt(const char* text, Args... args) {
    std::string out = text;
    for (const std::string& a : {std::to_string(args)...}) out.replace(out.find("{}"), 2, a);
    return out;
  }

  static Range region_of(const std::vector<size_t>& starts, size_t size, const ZipMap& m) {
    if (starts.empty()) return {0, size};
    return {starts.front(), m.end.empty() ? size : m.end.front()};
  }
  Range local_header(const ZipMap& m, size_t size) {
    if (m.local.empty()) return {0, std::min<size_t>(size, 64)};
    const size_t at = m.local[pick(m.local.size())];
    return {at, std::min(size, at + 30 + 64)};  // fixed part, name and the start of the extra field
  }
  static Range end_records(const ZipMap& m, size_t size) {
    if (m.end.empty()) return {size - std::min<size_t>(size, 22), size};
    return {m.end.front(), size};
  }

  std::string flip_in(std::string& b, Range r, const char* where) {
    if (r.end <= r.begin) r = {0, b.size()};
    const size_t n = 1 + pick(4);
    std::string what = std::string("flipped in ") + where + " at";
    for (size_t i = 0; i < n; ++i) {
      const size_t at = r.begin + pick(r.end - r.begin);
      const auto mask = static_cast<char>(pick(2) ? 1 << pick(8) : 1 + pick(255));
      b[at] = static_cast<char>(b[at] ^ mask);
      what += " " + std::to_string(at);
    }
    return what;
  }

  // A size, count, length or offset field of a zip structure set to a huge (or off-by-some) value.
  std::string huge_field(std::string& b, const ZipMap& m) {
    struct Field {
      size_t at, width;
    };
    std::vector<Field> fields;
    for (size_t at : m.central)
      for (Field f : {Field{20, 4}, {24, 4}, {28, 2}, {30, 2}, {32, 2}, {42, 4}})
        fields.push_back({at + f.at, f.width});
    for (size_t at : m.local)
      for (Field f : {Field{18, 4}, {22, 4}, {26, 2}, {28, 2}}) fields.push_back({at + f.at, f.width});
    for (size_t at : m.end) {
      const uint32_t sig = u32_at(b, at);
      if (sig == 0x06054b50)
        for (Field f : {Field{8, 2}, {10, 2}, {12, 4}, {16, 4}, {20, 2}})
          fields.push_back({at + f.at, f.width});
      if (sig == 0x06064b50)
        for (Field f : {Field{24, 8}, {32, 8}, {40, 8}, {48, 8}}) fields.push_back({at + f.at, f.width});
      if (sig == 0x07064b50) fields.push_back({at + 8, 8});
    }
    // zip64 extra fields of the central entries: 8-byte values after the name.
    for (size_t at : m.central) {
      const size_t name_len = static_cast<uint8_t>(b[at + 28]) | static_cast<uint8_t>(b[at + 29]) << 8;
      for (size_t k = 0; k < 3; ++k) fields.push_back({at + 46 + name_len + 4 + 8 * k, 8});
    }
    if (fields.empty()) return "no field";
    const Field f = fields[pick(fields.size())];
    const uint64_t max = f.width == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * f.width)) - 1;
    const uint64_t values[] = {max,          max - 1, max / 2, max / 2 + 1,       b.size(),
                               b.size() + 1, 0,       1,       uint64_t{1} << 31, (uint64_t{1} << 62) + 7};
    const uint64_t v = values[pick(std::size(values))] & max;
    put_le(b, f.at, v, f.width);
    return fmt("field of {} bytes at {} set to {}", f.width, f.at, v);
  }

  // An opcode of the pickle replaced by another, or a length argument made huge.
  std::string pickle_opcode(std::string& b, const ZipMap& m) {
    if (m.pickle_end <= m.pickle_begin) return flip_in(b, {0, b.size()}, "anywhere (no pickle)");
    static const char kOps[] = {'(', ')',    ']',    '}',    '0',    '2',    't',    'l',    'd',
                                'e', 'a',    'u',    's',    'R',    'b',    'c',    '\x93', 'q',
                                'r', 'h',    'j',    'X',    '\x8d', 'B',    '\x8e', 'T',    'U',
                                'Q', '\x81', '\x92', '\x85', '\x86', '\x87', '\x94', '\x95', '.',
                                'N', 'K',    'M',    'J',    '\x8a', '\x8b', 'C',    'p',    'g'};
    const size_t at = m.pickle_begin + pick(m.pickle_end - m.pickle_begin);
    if (pick(3) == 0) {
      // An integer argument (BININT1, BININT2, BININT: shapes, strides, offsets, storage sizes, counts).
      std::vector<size_t> ints;
      for (size_t i = m.pickle_begin; i + 5 <= m.pickle_end; ++i)
        if (b[i] == 'K' || b[i] == 'M' || b[i] == 'J') ints.push_back(i);
      if (!ints.empty()) {
        const size_t op = ints[pick(ints.size())];
        const size_t width = b[op] == 'K' ? 1 : b[op] == 'M' ? 2 : 4;
        const uint64_t v = pick(2) ? pick(5) : pick(3) ? pick(70000) : uint64_t{0x7fffffff} - pick(3);
        put_le(b, op + 1, v, width);
        return fmt("pickle int at {} set to {}", op, v);
      }
    }
    if (pick(3) == 0 && at + 9 <= m.pickle_end) {
      put_le(b, at, pick(2) ? ~uint64_t{0} : uint64_t{0x7fffffff}, 1 + pick(8));
      return fmt("pickle bytes at {} made huge", at);
    }
    b[at] = kOps[pick(sizeof(kOps))];
    return fmt("pickle opcode at {} replaced", at);
  }

  // Another file's bytes over this one, or a copy of this one under another (possibly absurd) rank.
  std::string duplicate(Source& s) {
    if (pick(2)) {
      const Source& other = sources_[pick(sources_.size())];
      write_file(work_ / s.name, other.bytes);
      restore_ = &s;
      return s.name + ": replaced by " + other.name;
    }
    static const char* kNames[] = {"mp_rank_07_model_states.pt",
                                   "mp_rank_99999999999_model_states.pt",
                                   "zero_pp_rank_5_mp_rank_00_optim_states.pt",
                                   "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt",
                                   "zero_pp_rank_99999999999_mp_rank_00_optim_states.pt",
                                   "zero_pp_rank_2_mp_rank_00_model_states.pt",
                                   "layer_07-model_states.pt",
                                   "layer_99999999999-model_states.pt",
                                   "mp_rank_00_model_states.pt",
                                   "layer_0_expert_1_mp_rank_00_model_states.pt",
                                   "layer_1_expert_0_mp_rank_00_model_states.pt",
                                   "expp_rank_0_mp_rank_00_optim_states.pt"};
    const std::string name = kNames[pick(std::size(kNames))];
    if (fs::exists(work_ / name)) {
      write_file(work_ / name, s.bytes);
      for (auto& other : sources_)
        if (other.name == name) restore_ = &other;
      return name + ": replaced by " + s.name;
    }
    write_file(work_ / name, s.bytes);
    extra_files_.push_back(work_ / name);
    return name + ": added as a copy of " + s.name;
  }

  fs::path work_;
  std::mt19937_64 rng_;
  std::vector<Source> sources_;
  Source* restore_ = nullptr;
  std::vector<fs::path> extra_files_;
};

// What the mutations of some checkpoints led to.
struct Outcomes {
  std::map<std::string, int> counts;
  int total = 0;
  int unchanged = 0;  // mutations that left every byte as it was (they test nothing)
  double slowest = 0;
  std::string slowest_what;
};

// `n` mutations of the tag dir `source` (each restored before the next), opened and read in `work`.
void corrupt_and_open(const fs::path& source, const std::string& label, uint32_t seed, int n,
                      const fs::path& work, Outcomes& out) {
  const fs::path tag_dir = work / label / "global_step3";
  Corrupter corrupter(source, tag_dir, seed);
  const io::SourcePtr tag_source = io::test_source(tag_dir);
  ASSERT_NO_THROW(read_views(*tag_source, open_checkpoint(*tag_source))) << label << " unmodified";
  for (int i = 0; i < n; ++i) {
    const std::string what = label + " #" + std::to_string(i) + " " + corrupter.mutate();
    if (!corrupter.changed()) ++out.unchanged;
    ++out.total;
    const auto start = std::chrono::steady_clock::now();
    try {
      read_views(*tag_source, open_checkpoint(*tag_source));
      ++out.counts["opened"];
    } catch (const Error& e) {
      ++out.counts["exit " + std::to_string(static_cast<int>(e.code()))];
      EXPECT_TRUE(std::string_view(e.what()).starts_with(tag_dir.string()))
          << what << "\n  message does not start with the file: " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << "\n  not a ckptfs::Error (" << typeid(e).name() << "): " << e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > out.slowest) out.slowest = seconds, out.slowest_what = what;
    corrupter.restore();
  }
}

// The test is only as strong as its inputs: nearly every mutation must change the checkpoint (a few
// write a field's own value back, or copy a file over itself), and most of them must be caught (the
// rest hit tensor bytes or fields a reader may legitimately ignore).
void expect_strong(const Outcomes& out) {
  for (const auto& [outcome, n] : out.counts) std::printf("  %-8s %d\n", outcome.c_str(), n);
  std::printf("  unchanged %d\n", out.unchanged);
  EXPECT_LE(out.unchanged, out.total / 20) << "mutations that changed nothing";
  const auto count = [&](const char* k) { return out.counts.count(k) ? out.counts.at(k) : 0; };
  EXPECT_GE(count("exit 4") + count("exit 5") + count("exit 3"), out.total / 2)
      << "fewer than half of the mutated checkpoints were refused";
  std::printf("  slowest: %.3f s (%s)\n", out.slowest, out.slowest_what.c_str());
  EXPECT_LT(out.slowest, 5.0) << out.slowest_what;
}

// tmpfs when there is one: rewriting a file on ext4 flushes it on close, which would dominate the runtime.
fs::path work_dir() {
  std::error_code ec;
  const fs::path tmp = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                           ? fs::path("/dev/shm")
                           : fs::temp_directory_path();
  const fs::path work = tmp / ("ckptfs-corrupt-" + std::to_string(::getpid()));
  fs::remove_all(work);
  return work;
}

TEST(CorruptInput, RealCheckpointsFailCleanlyOrOpen) {
  const fs::path work = work_dir();
  const std::vector<std::string> fixtures = {"z0_bf16_ws2", "z1_fp32_ws4", "z2_bf16_ws2", "z3_fp16_ws2",
                                             "pp2_z1_fp32_ws4"};
  Outcomes out;
  for (size_t f = 0; f < fixtures.size(); ++f)
    corrupt_and_open(kFixtures / fixtures[f] / "checkpoint/global_step3", fixtures[f],
                     1000 + static_cast<uint32_t>(f), 1500, work, out);
  fs::remove_all(work);
  expect_strong(out);
}

// DeepSpeed 0.19.5 Mixture of Experts (expert files, expert groups partitioned over EP ranks).
TEST(CorruptInput, RealMoeCheckpointFailsCleanlyOrOpens) {
  const fs::path work = work_dir();
  Outcomes out;
  corrupt_and_open(kFixtures019 / "moe_ep2_z2_bf16_ws2/checkpoint/global_step3", "moe_ep2_z2_bf16_ws2", 2000,
                   1500, work, out);
  fs::remove_all(work);
  expect_strong(out);
}

}  // namespace
}  // namespace ckptfs
