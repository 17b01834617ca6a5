// `ckptfs inspect SRC [--tag T] [--json] [--tensors]`: what the checkpoint holds and what ckptfs serves.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/describe.hpp"
#include "ckptfs/layout.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/source_argument.hpp"

namespace ckptfs::cli {

namespace {

constexpr const char* kInspectUsage =
    "ckptfs inspect SRC [--tag T] [--strict] [--strip-prefix P] [--config FILE] [--json] [--tensors]\n"
    "       (SRC s3://BUCKET/PREFIX: [--endpoint URL] [--region R] [--s3-path-style] [--s3-no-sign])";

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

void print_tensors(const catalog::Catalog& c, const std::string& title) {
  fmt::print("  {} tensors ({}):\n", title, c.tensors.size());
  for (const auto& t : c.tensors)
    fmt::print("    {:<48} {:<9} {:<16} {}\n", t.name, dtype_torch_name(t.dtype), shape_string(t.shape),
               t.origin);
}

void print_text(const io::Source& source, const Checkpoint& cp, bool tensors) {
  fmt::print("source:     {}\nframework:  {}\ntags:       ", cp.root.string(), cp.framework);
  for (size_t i = 0; i < cp.tags.size(); ++i) fmt::print("{}{}", i ? ", " : "", cp.tags[i].name);
  fmt::print(" (latest: {})\n", cp.latest);
  for (const auto& l : cp.left_out) fmt::print("left out:   tag {}: {}\n", l.name, l.error);
  for (const auto& t : cp.in_progress)
    fmt::print(
        "in progress: tag {}: its save is not complete (a mount serves it once it is: "
        "docs/mount.md#live-runs)\n",
        t);
  std::vector<std::vector<ViewFile>> views;
  for (const auto& tag : cp.tags) views.push_back(tag_views(source, tag));
  const auto refusals = gguf_refusals(source, cp, views);
  for (size_t i = 0; i < cp.tags.size(); ++i) {
    const Tag& tag = cp.tags[i];
    const auto& t = tag.topology;
    fmt::print("\ntag {}  ({})\n", tag.name, tag.dir.string());
    fmt::print("  format:     {}\n", tag.format);
    // ZeRO stages are DeepSpeed's; other frameworks partition (or not) their own way.
    const std::string zero = tag.deepspeed ? fmt::format("ZeRO-{}, ", tag.deepspeed->zero_stage) : "";
    const std::string moe = t.experts > 0 ? fmt::format(", EP {} ({} experts)", t.ep, t.experts) : "";
    fmt::print("  topology:   {}DP {}, TP {}, PP {}{}\n", zero, t.dp, t.tp, t.pp, moe);
    fmt::print("  optimizer:  {}\n", t.optimizer);
    fmt::print("  dtypes:     training {}, master float32\n", dtype_torch_name(t.train_dtype));
    fmt::print("  tensors:   ");
    const auto catalogs = tag.named_catalogs();
    for (const auto& [name, c] : catalogs) fmt::print(" {} {},", c->tensors.size(), name);
    fmt::print(" ({} source files)\n", tag.files.size());
    fmt::print("  views (mounted, or one streamed by `ckptfs cat SRC PATH`):\n");
    for (const auto& v : summarize_views(views[i], true)) {
      const std::string files = v.files == 1 ? "" : fmt::format(" in {} files", v.files);
      fmt::print("    {:<37} {:>16} bytes{}, reads {} of the sources\n", v.path, v.bytes, files,
                 *v.source_bytes);
    }
    for (const auto& note : tag.notes) fmt::print("  note: {}\n", note);
    if (const auto& why = refusals[i]) fmt::print("  note: no gguf/ (docs/formats/gguf.md): {}\n", *why);
    if (tensors)
      for (const auto& [name, c] : catalogs) print_tensors(*c, name);
  }
}

}  // namespace

int run_inspect(std::span<const std::string> args) {
  try {
    Arguments a = parse_arguments(args, {"--json", "--tensors", "--strict"}, 1, kInspectUsage);
    // What a mount of SRC serves: the complete saves.
    io::Runtime runtime;
    const io::SourcePtr source = open_source(a.positional[0], a.s3, runtime);
    Checkpoint cp = open_checkpoint(*source, complete_saves_only(a.open_options()));
    if (a.has("--json")) {
      fmt::print("{}\n", describe_checkpoint(*source, cp, a.has("--tensors")).dump(2));
    } else {
      print_text(*source, cp, a.has("--tensors"));
    }
    return 0;
  } catch (const std::exception& e) {
    return report_error(e);
  }
}

}  // namespace ckptfs::cli
