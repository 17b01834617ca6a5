// A DCP dir saved with use_collectives=False has no global .metadata: each rank wrote __<rank>.metadata
// describing only its own items (torch's save skips the gather that dedups replicated items), so the
// checkpoint is the merge of all of them.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <regex>
#include <unordered_map>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/dcp/dcp_metadata.hpp"
#include "formats/parallel_reads.hpp"

namespace ckptfs::dcp {

namespace fs = std::filesystem;

namespace {

const std::regex kRankMetadata(R"(__(\d+)\.metadata)");

[[noreturn]] void disagree(const Item& first, const Item& later, const std::string& what) {
  throw FormatError(fmt::format("{}: item {}: {}, which disagrees with {}", later.metadata_file.string(),
                                later.fqn, what, first.metadata_file.string()));
}

std::string shape_text(const Item& item) {
  return item.is_tensor
             ? fmt::format("a {} tensor [{}]", dtype_torch_name(item.dtype), fmt::join(item.size, ", "))
             : std::string("a bytes item");
}

// Adds a later rank's view of an item the merge already holds: its chunks that are new.
void merge_into(Item& held, const Item& later) {
  if (held.is_tensor != later.is_tensor || held.dtype != later.dtype || held.size != later.size)
    disagree(held, later, fmt::format("{} where the other rank has {}", shape_text(later), shape_text(held)));
  for (const Chunk& c : later.chunks) {
    auto same = std::find_if(held.chunks.begin(), held.chunks.end(),
                             [&](const Chunk& h) { return h.offsets == c.offsets; });
    if (same == held.chunks.end())
      held.chunks.push_back(c);
    else if (same->sizes != c.sizes)
      disagree(held, later,
               fmt::format("chunk at [{}] has sizes [{}], not [{}]", fmt::join(c.offsets, ", "),
                           fmt::join(c.sizes, ", "), fmt::join(same->sizes, ", ")));
  }
}

}  // namespace

bool is_rank_metadata_name(const std::string& file_name) {
  return std::regex_match(file_name, kRankMetadata);
}

std::vector<fs::path> metadata_files(const io::Source& source, const fs::path& dir) {
  if (source.is_file(dir / ".metadata")) return {dir / ".metadata"};
  std::vector<std::pair<unsigned long long, fs::path>> ranks;
  for (const auto& entry : source.list_directory(dir)) {
    std::smatch m;
    const std::string name = entry.path.filename().string();
    if (entry.is_file && std::regex_match(name, m, kRankMetadata))
      ranks.emplace_back(std::stoull(m[1].str()), entry.path);
  }
  std::sort(ranks.begin(), ranks.end());
  std::vector<fs::path> out;
  for (auto& r : ranks) out.push_back(std::move(r.second));
  return out;
}

Metadata read_dir_metadata(const io::Source& source, const fs::path& dir) {
  const auto files = metadata_files(source, dir);
  if (files.empty())
    throw SourceError(fmt::format("{}: no DCP metadata (.metadata or __<rank>.metadata)", dir.string()));
  auto ranks = formats::read_all(files, [&](const fs::path& f) { return read_metadata(source, f); });
  Metadata out = std::move(ranks.front());
  std::unordered_map<std::string, size_t> position;
  for (size_t i = 0; i < out.items.size(); ++i) position[out.items[i].fqn] = i;
  for (size_t f = 1; f < files.size(); ++f) {
    for (auto& item : ranks[f].items) {
      auto [it, fresh] = position.try_emplace(item.fqn, out.items.size());
      if (fresh)
        out.items.push_back(std::move(item));
      else
        merge_into(out.items[it->second], item);
    }
    out.files.push_back(files[f]);
  }
  return out;
}

}  // namespace ckptfs::dcp
