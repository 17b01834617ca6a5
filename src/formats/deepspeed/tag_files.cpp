#include "formats/deepspeed/tag_files.hpp"

#include <fmt/format.h>

#include <charconv>
#include <regex>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

namespace {

const std::regex kModelStates(R"(mp_rank_(\d+)_model_states\.pt)");
const std::regex kZero3ModelStates(R"(zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt)");
const std::regex kOptimStates(R"((bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_?optim_states\.pt)");
const std::regex kLayerStates(R"(layer_(\d+)(-model_(\d+))?-model_states\.pt)");
const std::regex kExpertStates(R"((layer_(\d+)_)?expert_(\d+)_mp_rank_(\d+)_model_states\.pt)");
const std::regex kExpertOptimStates(R"(expp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt)");

// A rank or layer number of a file name; absurdly large ones are a naming error, not a crash.
int number(const std::ssub_match& m, const fs::path& path) {
  if (!m.matched) return 0;
  int n = 0;
  const std::string digits = m.str();
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc{} || end != digits.data() + digits.size())
    throw FormatError(
        fmt::format("{}: rank or layer number {} in the file name is out of range", path.string(), digits));
  return n;
}

template <typename Map, typename Key>
void insert_unique(Map& map, Key key, const fs::path& path) {
  auto [it, inserted] = map.emplace(key, path);
  if (!inserted)
    throw FormatError(fmt::format("{}: same rank as {} (ranks are numbered twice)", path.string(),
                                  it->second.filename().string()));
}

}  // namespace

std::vector<fs::path> TagFiles::all() const {
  std::vector<fs::path> out;
  for (const auto& [mp, p] : model_states) out.push_back(p);
  for (const auto& [mp, ranks] : zero3_model_states)
    for (const auto& [dp, p] : ranks) out.push_back(p);
  for (const auto& [mp, ranks] : optim_states)
    for (const auto& [dp, p] : ranks) out.push_back(p);
  for (const auto& [layer, tps] : layer_states)
    for (const auto& [tp, p] : tps) out.push_back(p);
  for (const auto& [layer, experts] : expert_states)
    for (const auto& [expert, p] : experts) out.push_back(p);
  for (const auto& [ep, p] : expert_optim_states) out.push_back(p);
  return out;
}

TagFiles list_tag_files(const io::Source& source, const fs::path& dir) {
  TagFiles files;
  if (!source.is_directory(dir))
    throw SourceError(fmt::format("{}: cannot list: not a directory", dir.string()));
  for (const auto& entry : source.list_directory(dir)) {
    if (!entry.is_file) continue;
    const std::string name = entry.path.filename().string();
    std::smatch m;
    const auto num = [&](size_t group) { return number(m[group], entry.path); };
    if (std::regex_match(name, m, kExpertStates)) {
      // Legacy expert_E files (no layer id) and tensor-parallel experts are not merged.
      if (!m[1].matched || num(4) != 0)
        files.unsupported_expert_files.push_back(entry.path);
      else
        insert_unique(files.expert_states[num(2)], num(3), entry.path);
    } else if (std::regex_match(name, m, kExpertOptimStates)) {
      if (num(2) != 0)
        files.unsupported_expert_files.push_back(entry.path);
      else
        insert_unique(files.expert_optim_states, num(1), entry.path);
    } else if (std::regex_match(name, m, kZero3ModelStates)) {
      insert_unique(files.zero3_model_states[num(2)], num(1), entry.path);
    } else if (std::regex_match(name, m, kModelStates)) {
      insert_unique(files.model_states, num(1), entry.path);
    } else if (std::regex_match(name, m, kOptimStates)) {
      if (m[1].matched && m[1].str() == "bf16_") files.bf16_prefix = true;
      insert_unique(files.optim_states[num(3)], num(2), entry.path);
    } else if (std::regex_match(name, m, kLayerStates)) {
      insert_unique(files.layer_states[num(1)], num(3), entry.path);
    }
  }
  return files;
}

bool is_tag_dir(const io::Source& source, const fs::path& dir) {
  for (const auto& entry : source.list_directory(dir)) {
    const std::string name = entry.path.filename().string();
    if (std::regex_match(name, kModelStates) || std::regex_match(name, kZero3ModelStates)) return true;
  }
  return false;
}

}  // namespace ckptfs::deepspeed
