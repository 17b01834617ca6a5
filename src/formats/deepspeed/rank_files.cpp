#include "formats/deepspeed/rank_files.hpp"

#include <fmt/format.h>

#include <functional>
#include <map>

#include "ckptfs/error.hpp"
#include "formats/parallel_reads.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

namespace {

std::string optim_name(const TagFiles& tf, int dp, int mp) {
  return fmt::format("{}zero_pp_rank_{}_mp_rank_{:02d}_optim_states.pt", tf.bf16_prefix ? "bf16_" : "", dp,
                     mp);
}

std::string zero3_model_name(int dp, int mp) {
  return fmt::format("zero_pp_rank_{}_mp_rank_{:02d}_model_states.pt", dp, mp);
}

// Ranks must be exactly 0..N-1.
void require_contiguous(const std::map<int, fs::path>& ranks, const fs::path& dir,
                        const std::function<std::string(int)>& name_of) {
  int expected = 0;
  for (const auto& [rank, path] : ranks) {
    if (rank != expected)
      throw FormatError(fmt::format("{}: missing (rank {} of {} rank files found, the highest being {})",
                                    (dir / name_of(expected)).string(), expected, ranks.size(),
                                    path.filename().string()));
    ++expected;
  }
}

// The world size the files agree on: the value that matches the number of files if any file says so,
// else rank 0's. A file that disagrees names itself; a shortfall names the first missing file.
// MoE expert groups are partitioned over the expert data-parallel group instead (moe_experts.cpp checks
// them).
void check_world_size(const std::vector<OptimStates>& ranks, const fs::path& dir,
                      const std::function<std::string(int)>& name_of) {
  const int64_t n_files = static_cast<int64_t>(ranks.size());
  const auto dense_counts = [](const OptimStates& r) {
    std::vector<int64_t> out;
    for (size_t g = 0; g < r.partition_count.size(); ++g)
      if (g >= r.expert_groups.size() || !r.expert_groups[g]) out.push_back(r.partition_count[g]);
    return out;
  };
  int64_t reference = ranks.front().partition_count.front();
  for (const auto& r : ranks)
    for (int64_t c : dense_counts(r))
      if (c == n_files) reference = n_files;
  for (const auto& r : ranks)
    for (int64_t c : dense_counts(r))
      if (c != reference)
        throw FormatError(
            fmt::format("{}: partition_count is {} but the other rank files say {} (a file from another run "
                        "or world size?)",
                        r.path.string(), c, reference));
  if (reference > n_files)
    throw FormatError(fmt::format("{}: missing: partition_count is {} but only {} optimizer files are in {}",
                                  (dir / name_of(static_cast<int>(n_files))).string(), reference, n_files,
                                  dir.string()));
  if (reference < n_files)
    throw FormatError(
        fmt::format("{}: partition_count is {} but {} optimizer files are in {}; {} does not belong",
                    ranks.front().path.string(), reference, n_files, dir.string(),
                    ranks.back().path.filename().string()));
}

}  // namespace

std::vector<OptimStates> read_optim_ranks(io::FileSet& files, const TagFiles& tf, int mp) {
  auto it = tf.optim_states.find(mp);
  const fs::path dir = tf.model_states.count(mp) ? tf.model_states.at(mp).parent_path()
                                                 : tf.zero3_model_states.at(mp).begin()->second.parent_path();
  auto name_of = [&](int dp) { return optim_name(tf, dp, mp); };
  if (it == tf.optim_states.end())
    throw FormatError(fmt::format("{}: missing: the tag has no optimizer files for mp rank {}",
                                  (dir / name_of(0)).string(), mp));
  require_contiguous(it->second, dir, name_of);
  std::vector<fs::path> paths;
  for (const auto& [dp, path] : it->second) paths.push_back(path);
  std::vector<OptimStates> out =
      formats::read_all(paths, [&](const fs::path& p) { return read_optim_states(files, p); });
  check_world_size(out, dir, name_of);
  return out;
}

std::vector<ModelStates> read_zero3_model_ranks(io::FileSet& files, const TagFiles& tf, int mp) {
  const auto& ranks = tf.zero3_model_states.at(mp);
  const fs::path dir = ranks.begin()->second.parent_path();
  require_contiguous(ranks, dir, [&](int dp) { return zero3_model_name(dp, mp); });
  std::vector<fs::path> paths;
  for (const auto& [dp, path] : ranks) paths.push_back(path);
  return formats::read_all(paths, [&](const fs::path& p) { return read_model_states(files, p); });
}

std::string layer_prefix(int layer, const std::vector<NamedTensor>& entries,
                         const std::set<std::string>& known) {
  const std::string numbered = fmt::format("{}.", layer);
  for (const auto& e : entries)
    if (known.count(numbered + e.name)) return numbered;
  // A TiedLayerSpec's weights live under tied_modules.<key>. whatever the layer index.
  static const std::string kTied = "tied_modules.";
  for (const auto& name : known) {
    if (name.rfind(kTied, 0) != 0) continue;
    const size_t dot = name.find('.', kTied.size());
    if (dot == std::string::npos) continue;
    const std::string prefix = name.substr(0, dot + 1);
    for (const auto& e : entries)
      if (name == prefix + e.name) return prefix;
  }
  return numbered;
}

}  // namespace ckptfs::deepspeed
