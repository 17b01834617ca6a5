// The legacy layout (--ckpt-format torch): one model_optim_rng.pt per (TP rank, PP rank[, EP rank]) dir.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <regex>
#include <tuple>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/megatron/fp32_masters.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/megatron/model_assembly.hpp"
#include "formats/megatron/state_names.hpp"
#include "formats/parallel_reads.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;
using formats::Field;

namespace {

constexpr const char* kModelFile = "model_optim_rng.pt";

struct RankDir {
  std::vector<int> numbers;  // mp_rank_01_002 -> {1, 2}
  fs::path dir;
};

std::vector<RankDir> rank_dirs(const io::Source& source, const fs::path& dir) {
  static const std::regex kName(R"(mp_rank_(\d{2,})((?:_\d{3,}){0,2}))");
  std::vector<RankDir> out;
  for (const auto& entry : source.list_directory(dir)) {
    std::smatch m;
    const std::string name = entry.path.filename().string();
    if (!entry.is_directory || !std::regex_match(name, m, kName)) continue;
    RankDir r{{std::stoi(m[1].str())}, entry.path};
    const std::string rest = m[2].str();  // "_002" or "_002_001"
    for (size_t at = 1; at < rest.size();) {
      const size_t end = std::min(rest.find('_', at), rest.size());
      r.numbers.push_back(std::stoi(rest.substr(at, end - at)));
      at = end + 1;
    }
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

// The merged fp32 masters of every rank file (fp32_from_fp16_params or distrib_optim.pt); null, with a
// note on `tag`, when the files hold none or keep them in a layout ckptfs does not map yet (the model
// views are served all the same).
std::shared_ptr<catalog::Catalog> read_masters(io::FileSet& files, const ModelArgs& args,
                                               const ChunkedModel& model,
                                               const std::vector<std::vector<std::vector<RankFile>>>& ranks,
                                               Tag& tag) {
  ChunkedModel::Masters masters(args.pp, std::vector<std::vector<std::vector<torch::SourceTensor>>>(args.ep));
  std::string missing;
  // Every rank's distrib_optim.pt up to the first one missing, opened in parallel; what the masters point
  // into stays open until merged.
  std::vector<fs::path> optim_paths;
  if (args.distributed_optimizer)
    for (const auto& pp : ranks)
      for (const auto& ep : pp)
        for (const auto& f : ep) {
          const fs::path optim = f.archive.file()->path().parent_path() / "distrib_optim.pt";
          if (missing.empty() && !files.source().is_file(optim))
            missing = fmt::format("{} is missing", optim.string());
          if (missing.empty()) optim_paths.push_back(optim);
        }
  try {
    const auto optim_files = formats::read_all(
        optim_paths, [&](const fs::path& p) { return torch::TorchArchive::open(files.open(p)); });
    size_t next_optim = 0;
    bool done = false;  // at the first rank without masters
    for (int pp = 0; pp < args.pp && !done; ++pp)
      for (int ep = 0; ep < args.ep && !done; ++ep)
        for (int tp = 0; tp < args.tp && !done; ++tp) {
          const auto params = model.params_of(pp, ep, tp);
          const RankFile& f = ranks[pp][ep][tp];
          if (args.distributed_optimizer) {
            done = next_optim == optim_files.size();  // the missing one
            if (done) break;
            const auto& optim = optim_files[next_optim++];
            masters[pp][ep].push_back(
                masters_from_distrib_optim(optim, params, args.dp, args.ddp_bucket_size, ep));
            tag.files.push_back(optim.file()->path());
          } else if (const Field opt = f.root()["optimizer"]; opt.present()) {
            masters[pp][ep].push_back(masters_from_optimizer(opt, params));
          } else {
            missing = fmt::format("{} was saved without optimizer state", f.archive.file()->path().string());
            done = true;
          }
        }
  } catch (const UnsupportedError& e) {
    missing = e.what();
  }
  if (missing.empty()) return model.merge_masters(masters);
  tag.notes.push_back("no fp32 master weights: " + missing + ", so no fp32/ views");
  return nullptr;
}

}  // namespace

bool is_legacy_iteration(const io::Source& source, const fs::path& dir) {
  for (const auto& r : rank_dirs(source, dir)) {
    if (source.is_file(r.dir / kModelFile)) return true;
  }
  return false;
}

Iteration read_legacy_iteration(io::FileSet& files, const fs::path& dir, const std::string& name) {
  const auto dirs = rank_dirs(files.source(), dir);
  if (dirs.empty()) throw SourceError(fmt::format("{}: no mp_rank_* dirs", dir.string()));
  const auto open = [&](const fs::path& rank_dir) {
    const fs::path path = rank_dir / kModelFile;
    if (!files.source().is_file(path))
      throw FormatError(fmt::format("{}: missing (every rank dir holds one)", path.string()));
    return torch::TorchArchive::open(files.open(path));
  };
  auto first = open(dirs.front().dir);
  const ModelArgs args = read_model_args(formats::root_field(first)["args"]);
  // Megatron-LM names a legacy rank file by TP, PP and EP rank only: the expert-TP ranks of one expert that
  // share a TP rank write the same file, and the last one's part of every expert is all it keeps
  if (args.num_experts > 0 && args.etp > 1 && args.etp != args.tp)
    throw FormatError(
        fmt::format("{}: saved with expert tensor parallelism {} under TP {} in the legacy format, which "
                    "loses part of every "
                    "expert: the expert-TP ranks that share a TP rank write the same mp_rank_* file, so it "
                    "holds one of their "
                    "{} slices of each expert; save with --ckpt-format "
                    "torch_dist, or with expert_tensor_parallel_size equal to tensor_model_parallel_size",
                    dir.string(), args.etp, args.tp, args.etp));
  if (args.num_experts > 0 && (args.etp != args.tp || args.num_experts % args.ep != 0))
    throw UnsupportedError(
        fmt::format("{}: experts with expert TP {} under TP {} ({} experts over EP {}) are not merged yet",
                    dir.string(), args.etp, args.tp, args.num_experts, args.ep));
  // The dir name's numbers after the TP rank: the PP rank when PP > 1, then the EP rank when EP > 1.
  const size_t suffixes = 1 + (args.pp > 1 ? 1 : 0) + (args.ep > 1 ? 1 : 0);
  std::map<std::tuple<int, int, int>, fs::path> by_rank;  // (pp, ep, tp) -> dir
  for (const auto& r : dirs) {
    const int pp = args.pp > 1 ? r.numbers[1] : 0;
    const int ep = args.ep > 1 ? r.numbers.back() : 0;
    if (r.numbers.size() != suffixes || r.numbers[0] >= args.tp || pp >= args.pp || ep >= args.ep)
      throw FormatError(fmt::format("{}: does not fit the saved args (TP {}, PP {}, EP {}; {})",
                                    r.dir.string(), args.tp, args.pp, args.ep,
                                    first.file()->path().string()));
    by_rank[{pp, ep, r.numbers[0]}] = r.dir;
  }
  const auto dir_name = [&](int pp, int ep, int tp) {
    std::string n = fmt::format("mp_rank_{:02}", tp);
    if (args.pp > 1) n += fmt::format("_{:03}", pp);
    if (args.ep > 1) n += fmt::format("_{:03}", ep);
    return n;
  };
  const auto rank_dir = [&](int pp, int ep, int tp) -> const fs::path& {
    auto it = by_rank.find({pp, ep, tp});
    if (it == by_rank.end())
      throw FormatError(fmt::format("{}: rank dir {} is missing (the saved args say TP {}, PP {}, EP {})",
                                    dir.string(), dir_name(pp, ep, tp), args.tp, args.pp, args.ep));
    return it->second;
  };
  // Every rank file the args call for, read in parallel; the checks run per rank as a serial loop would.
  rank_dir(0, 0, 0);  // when it is there, it is the first rank dir, already read
  RankFile reference{std::move(first), {}};
  for (const Field& chunk : model_chunks(reference.root())) reference.chunks.push_back(flatten_state(chunk));
  const fs::path reference_path = reference.archive.file()->path();
  const auto read_rank = [&](const std::tuple<int, int, int>& rank) {
    RankFile f{open(std::apply(rank_dir, rank)), {}};
    const ModelArgs own = read_model_args(f.root()["args"]);
    if (own.tp != args.tp || own.pp != args.pp || own.ep != args.ep)
      throw FormatError(fmt::format("{}: its args say TP {}, PP {}, EP {}; {} says TP {}, PP {}, EP {}",
                                    f.archive.file()->path().string(), own.tp, own.pp, own.ep,
                                    reference_path.string(), args.tp, args.pp, args.ep));
    for (const Field& chunk : model_chunks(f.root())) f.chunks.push_back(flatten_state(chunk));
    if (f.chunks.size() != reference.chunks.size())
      throw FormatError(fmt::format("{}: {} model chunks, {} has {}", f.archive.file()->path().string(),
                                    f.chunks.size(), reference_path.string(), reference.chunks.size()));
    return f;
  };
  std::vector<std::tuple<int, int, int>> others;  // (pp, ep, tp) after (0, 0, 0), in order
  for (int pp = 0; pp < args.pp; ++pp)
    for (int ep = 0; ep < args.ep; ++ep)
      for (int tp = 0; tp < args.tp; ++tp)
        if (pp + ep + tp > 0) others.emplace_back(pp, ep, tp);
  auto read = formats::read_all(others, read_rank);
  // [pp][ep][tp]; complete before the model chunks below point into it.
  std::vector<std::vector<std::vector<RankFile>>> ranks(args.pp, std::vector<std::vector<RankFile>>(args.ep));
  ranks[0][0].push_back(std::move(reference));
  for (size_t i = 0; i < others.size(); ++i) {
    const auto [pp, ep, tp] = others[i];
    ranks[pp][ep].push_back(std::move(read[i]));
  }

  ChunkedModel model(args);
  const size_t vp = ranks[0][0][0].chunks.size();
  for (size_t v = 0; v < vp; ++v)
    for (int pp = 0; pp < args.pp; ++pp) {
      ModelChunk chunk;
      chunk.pp = pp;
      chunk.vp = v;
      for (const auto& ep : ranks[pp]) {
        chunk.ranks.emplace_back();
        for (const auto& f : ep) chunk.ranks.back().push_back(&f.chunks[v]);
      }
      chunk.file_of = [&ranks, pp](size_t ep, size_t tp) { return ranks[pp][ep][tp].archive.file()->path(); };
      model.add_chunk(std::move(chunk));
    }
  Iteration it;
  it.args = args;
  it.tag.name = name;
  it.tag.dir = dir;
  it.tag.format = "Megatron-LM checkpoint (legacy torch format)";
  it.tag.add(ViewRole::model, model.merge_model());
  it.tag.notes = model.notes();
  for (const auto& pp : ranks)
    for (const auto& ep : pp)
      for (const auto& f : ep) it.tag.files.push_back(f.archive.file()->path());

  // fp32 masters: per rank file, aligned with its parameters.
  if (args.params_dtype == DType::F32) {
    it.tag.add(ViewRole::fp32, it.tag.catalog(ViewRole::model));
  } else if (auto fp32 = read_masters(files, args, model, ranks, it.tag)) {
    it.tag.add(ViewRole::fp32, std::move(fp32));
  }
  it.tag.topology.optimizer =
      args.distributed_optimizer ? "Megatron DistributedOptimizer" : "Megatron mixed-precision optimizer";
  return it;
}

}  // namespace ckptfs::megatron
