// The legacy layout (--ckpt-format torch): one model_optim_rng.pt per (TP rank, PP rank[, EP rank]) dir.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <regex>

#include "ckptfs/error.hpp"
#include "formats/megatron/fp32_masters.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/megatron/model_assembly.hpp"
#include "formats/megatron/state_names.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;
using formats::Field;

namespace {

constexpr const char* kModelFile = "model_optim_rng.pt";

struct RankDir {
  std::vector<int> numbers;  // mp_rank_01_002 -> {1, 2}
  fs::path dir;
};

std::vector<RankDir> rank_dirs(const fs::path& dir) {
  static const std::regex kName(R"(mp_rank_(\d{2,})((?:_\d{3,}){0,2}))");
  std::vector<RankDir> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory(ec) || !std::regex_match(name, m, kName)) continue;
    RankDir r{{std::stoi(m[1].str())}, entry.path()};
    for (size_t at = 1; at < m[2].length(); at += 4) r.numbers.push_back(std::stoi(m[2].str().substr(at, 3)));
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const RankDir& a, const RankDir& b) { return a.numbers < b.numbers; });
  return out;
}

// The model chunks of a rank file: "model", or "model0".."modelN" with virtual pipelining.
std::vector<Field> model_chunks(const Field& root) {
  if (Field m = root["model"]; m.present()) return {m};
  std::vector<Field> out;
  for (size_t v = 0;; ++v) {
    Field m = root[fmt::format("model{}", v)];
    if (!m.present()) break;
    out.push_back(m);
  }
  if (out.empty()) root.fail("no 'model' (or 'model0') entry: not a Megatron-LM model file");
  return out;
}

struct RankFile {
  torch::TorchArchive archive;
  std::vector<std::vector<std::pair<std::string, Field>>> chunks;  // flattened model chunks
  Field root() const { return formats::root_field(archive); }
};

}  // namespace

bool is_legacy_iteration(const fs::path& dir) {
  for (const auto& r : rank_dirs(dir)) {
    std::error_code ec;
    if (fs::is_regular_file(r.dir / kModelFile, ec)) return true;
  }
  return false;
}

Iteration read_legacy_iteration(io::FileSet& files, const fs::path& dir, const std::string& name) {
  const auto dirs = rank_dirs(dir);
  if (dirs.empty()) throw SourceError(fmt::format("{}: no mp_rank_* dirs", dir.string()));
  const auto open = [&](const fs::path& rank_dir) {
    const fs::path path = rank_dir / kModelFile;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      throw FormatError(fmt::format("{}: missing (every rank dir holds one)", path.string()));
    return torch::TorchArchive::open(files.open(path));
  };
  auto first = open(dirs.front().dir);
  const ModelArgs args = read_model_args(formats::root_field(first)["args"]);
  if (args.ep > 1)
    throw UnsupportedError(fmt::format("{}: expert parallelism (EP {}) is not merged yet", dir.string(), args.ep));
  const size_t suffixes = 1 + (args.pp > 1 ? 1 : 0);
  std::map<std::pair<int, int>, fs::path> by_rank;  // (tp, pp) -> dir
  for (const auto& r : dirs) {
    if (r.numbers.size() != suffixes || r.numbers[0] >= args.tp || (args.pp > 1 && r.numbers[1] >= args.pp))
      throw FormatError(fmt::format("{}: does not fit the saved args (TP {}, PP {}; {})", r.dir.string(), args.tp,
                                    args.pp, first.file()->path().string()));
    by_rank[{r.numbers[0], args.pp > 1 ? r.numbers[1] : 0}] = r.dir;
  }
  // files[pp][tp]
  std::vector<std::vector<RankFile>> ranks(args.pp);
  for (int pp = 0; pp < args.pp; ++pp)
    for (int tp = 0; tp < args.tp; ++tp) {
      auto it = by_rank.find({tp, pp});
      if (it == by_rank.end())
        throw FormatError(fmt::format("{}: rank dir {} is missing (the saved args say TP {}, PP {})", dir.string(),
                                      args.pp > 1 ? fmt::format("mp_rank_{:02}_{:03}", tp, pp) : fmt::format("mp_rank_{:02}", tp),
                                      args.tp, args.pp));
      RankFile f{pp == 0 && tp == 0 ? std::move(first) : open(it->second), {}};
      const ModelArgs own = read_model_args(f.root()["args"]);
      if (own.tp != args.tp || own.pp != args.pp)
        throw FormatError(fmt::format("{}: its args say TP {}, PP {}; {} says TP {}, PP {}",
                                      f.archive.file()->path().string(), own.tp, own.pp,
                                      ranks[0].empty() ? "" : ranks[0][0].archive.file()->path().string(), args.tp, args.pp));
      for (const Field& chunk : model_chunks(f.root())) f.chunks.push_back(flatten_state(chunk));
      if (!ranks[0].empty() && f.chunks.size() != ranks[0][0].chunks.size())
        throw FormatError(fmt::format("{}: {} model chunks, {} has {}", f.archive.file()->path().string(),
                                      f.chunks.size(), ranks[0][0].archive.file()->path().string(),
                                      ranks[0][0].chunks.size()));
      ranks[pp].push_back(std::move(f));
    }

  ChunkedModel model(args);
  const size_t vp = ranks[0][0].chunks.size();
  for (size_t v = 0; v < vp; ++v)
    for (int pp = 0; pp < args.pp; ++pp) {
      ModelChunk chunk;
      chunk.pp = pp;
      chunk.vp = v;
      for (const auto& f : ranks[pp]) chunk.ranks.push_back(&f.chunks[v]);
      chunk.file_of = [&, pp](size_t tp) { return ranks[pp][tp].archive.file()->path(); };
      model.add_chunk(std::move(chunk), vp);
    }
  Iteration it;
  it.args = args;
  it.tag.name = name;
  it.tag.dir = dir;
  it.tag.format = "Megatron-LM checkpoint (legacy torch format)";
  it.tag.catalogs.emplace("model", model.merge_model());
  it.tag.notes = model.notes();
  for (const auto& pp : ranks)
    for (const auto& f : pp) it.tag.files.push_back(f.archive.file()->path());

  // fp32 masters: per rank file, aligned with its parameters.
  if (args.params_dtype == DType::F32) {
    it.tag.catalogs.emplace("fp32", it.tag.catalogs.at("model"));
  } else {
    std::vector<std::vector<std::vector<torch::SourceTensor>>> masters(args.pp);  // [pp][tp] aligned with params
    bool have = true;
    std::vector<torch::TorchArchive> optim_files;
    for (int pp = 0; pp < args.pp && have; ++pp)
      for (int tp = 0; tp < args.tp && have; ++tp) {
        const auto params = model.params_of(pp, tp);
        const RankFile& f = ranks[pp][tp];
        const fs::path optim = f.archive.file()->path().parent_path() / "distrib_optim.pt";
        std::error_code ec;
        if (args.distributed_optimizer && fs::is_regular_file(optim, ec)) {
          optim_files.push_back(torch::TorchArchive::open(files.open(optim)));
          masters[pp].push_back(masters_from_distrib_optim(optim_files.back(), params));
          it.tag.files.push_back(optim);
        } else if (const Field opt = f.root()["optimizer"]; opt.present() && opt["fp32_from_fp16_params"].present()) {
          masters[pp].push_back(masters_from_fp16_params(opt, params));
        } else {
          have = false;
          it.tag.notes.push_back(fmt::format("{} holds no fp32 master weights ({}): no fp32/ views",
                                             args.distributed_optimizer ? optim.string() : f.archive.file()->path().string(),
                                             args.distributed_optimizer ? "file missing" : "saved without optimizer state"));
        }
      }
    if (have) it.tag.catalogs.emplace("fp32", model.merge_masters(masters));
  }
  it.tag.topology.optimizer = args.distributed_optimizer ? "Megatron DistributedOptimizer" : "Megatron mixed-precision optimizer";
  return it;
}

}  // namespace ckptfs::megatron
