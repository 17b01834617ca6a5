// Reads one DeepSpeed tag: its files listed, its layout decided (tag_layout.hpp), and the layout's reader
// run (layout_readers.hpp).
#include <fmt/format.h>

#include <stdexcept>

#include "ckptfs/deepspeed.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/overloaded.hpp"
#include "formats/deepspeed/layout_readers.hpp"
#include "formats/deepspeed/moe_experts.hpp"
#include "formats/deepspeed/tag_catalogs.hpp"
#include "formats/deepspeed/universal_input.hpp"

namespace ckptfs::deepspeed {

using catalog::Catalog;
namespace fs = std::filesystem;

namespace {

TagParts read_parts(io::FileSet& files, const TagFiles& tf, const fs::path& dir, int mp, RankLayout layout,
                    DeepSpeedTopology& topo, std::vector<std::string>& notes) {
  switch (layout) {
    case RankLayout::data_parallel:
      return read_data_parallel(files, tf, mp, topo, notes);
    case RankLayout::zero3:
      return read_zero3(files, tf, topo);
    case RankLayout::pipeline:
      return read_pipeline(files, tf, topo, notes);
    case RankLayout::universal:
      return read_universal(files, tf, dir, topo, notes);
    case RankLayout::zero3_universal:
      return read_zero3_universal(files, tf, dir, topo);
  }
  throw std::logic_error("unknown DeepSpeed rank layout");
}

}  // namespace

RankTag read_rank(io::FileSet& files, const TagFiles& tf, const fs::path& dir, const std::string& name,
                  int mp, RankLayout layout) {
  Tag tag;
  tag.name = name;
  tag.dir = dir;
  tag.files = tf.all();
  // ZeRO-3 model states hold placeholders in `module`: the model view is made of the masters.
  const bool zero3 = layout == RankLayout::zero3 || layout == RankLayout::zero3_universal;
  const bool universal = layout == RankLayout::universal || layout == RankLayout::zero3_universal;
  tag.format = universal ? kUniversalFormat : "DeepSpeed checkpoint";
  DeepSpeedTopology topo;
  TagParts parts = read_parts(files, tf, dir, mp, layout, topo, tag.notes);
  tag.topology = topo;
  tag.deepspeed = DeepSpeedTag{topo.zero_stage, nullptr};
  if (universal) add_master_files(tag, parts);
  auto model = std::make_shared<Catalog>(build_model_catalog(parts, zero3, tag.notes));
  auto fp32 = std::make_shared<Catalog>(build_fp32_catalog(parts, module_tensors(parts), tag.notes));
  finish_tag(tag, parts, fp32, model, zero3);
  return {std::move(tag), std::move(parts.buffers)};
}

Tag read_tag(io::FileSet& files, const fs::path& dir, const std::string& name) {
  TagFiles tf = list_tag_files(files.source(), dir);
  if (tf.empty()) throw SourceError(fmt::format("{}: no DeepSpeed model-state files", dir.string()));
  require_supported_moe(tf, is_universal_dir(files.source(), dir));
  return std::visit(
      Overloaded{
          [&](RankLayout layout) { return read_rank(files, tf, dir, name, first_mp_rank(tf), layout).tag; },
          [&](TensorParallel) { return read_tensor_parallel(files, tf, dir, name); },
          [&](PipelineTensorParallel) { return read_pipeline_tensor_parallel(files, tf, dir, name); },
          [&](TensorParallelUniversal) { return read_tensor_parallel_universal(files, tf, dir, name); },
      },
      tag_layout(files, tf, dir));
}

}  // namespace ckptfs::deepspeed
