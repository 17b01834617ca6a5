#include "formats/fsdp/rank_files.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <regex>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"

namespace ckptfs::formats::fsdp {

namespace fs = std::filesystem;

namespace {

// NAME ends with "rank", an optional _ or -, the rank and a torch.save extension
const std::regex kRankFile(R"((.*rank[_-]?)(\d{1,6})(\.pt|\.pth|\.bin))");

// verl's and accelerate's other per-rank files (optimizer state, RNG state): never a model
bool is_other_state(const std::string& name) {
  return name.starts_with("optim") || name.starts_with("extra_state") || name.starts_with("random_states") ||
         name.starts_with("scheduler");
}

}  // namespace

std::vector<RankFiles> rank_file_groups(const io::Source& source, const fs::path& dir) {
  std::map<std::pair<std::string, std::string>, std::map<int, fs::path>>
      groups;  // (stem, extension) -> rank -> file
  for (const auto& entry : source.list_directory(dir)) {
    const std::string name = entry.path.filename().string();
    std::smatch m;
    if (entry.is_file && !is_other_state(name) && std::regex_match(name, m, kRankFile))
      groups[{m[1].str(), m[3].str()}][std::stoi(m[2].str())] = entry.path;
  }
  std::vector<RankFiles> out;  // accelerate's pytorch_model_fsdp_rank before pytorch_model_fsdp_1_rank
  for (const auto& [key, ranks] : groups) {
    const auto& [stem, extension] = key;
    RankFiles g{fmt::format("{}{{R}}{}", stem, extension), stem, {}};
    const int world = ranks.rbegin()->first + 1;
    for (int r = 0; r < world; ++r) {
      const auto it = ranks.find(r);
      if (it == ranks.end())
        throw FormatError(fmt::format("{}: missing ({} holds ranks up to {}: every rank saves its file)",
                                      (dir / fmt::format("{}{}{}", stem, r, extension)).string(), g.pattern,
                                      world - 1));
      g.files.push_back(it->second);
    }
    out.push_back(std::move(g));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const RankFiles& a, const RankFiles& b) { return a.stem.size() < b.stem.size(); });
  return out;
}

bool has_rank_files(const io::Source& source, const fs::path& dir) {
  for (const auto& entry : source.list_directory(dir)) {
    const std::string name = entry.path.filename().string();
    if (entry.is_file && !is_other_state(name) && std::regex_match(name, kRankFile)) return true;
  }
  return false;
}

}  // namespace ckptfs::formats::fsdp
