#include "ckptfs/describe.hpp"

#include <algorithm>

#include "ckptfs/layout.hpp"

namespace ckptfs {

namespace {

nlohmann::json describe_tensors(const catalog::Catalog& c) {
  auto out = nlohmann::json::array();
  for (const auto& t : c.tensors)
    out.push_back(
        {{"name", t.name}, {"dtype", dtype_torch_name(t.dtype)}, {"shape", t.shape}, {"origin", t.origin}});
  return out;
}

}  // namespace

nlohmann::json describe_checkpoint(const io::Source& source, const Checkpoint& cp, bool with_tensors) {
  std::vector<std::vector<ViewFile>> views;
  for (const auto& tag : cp.tags) views.push_back(tag_views(source, tag));
  return describe_checkpoint(cp, with_tensors, views, gguf_refusals(source, cp, views), true);
}

std::vector<std::optional<std::string>> gguf_refusals(const io::Source& source, const Checkpoint& cp,
                                                      const std::vector<std::vector<ViewFile>>& views,
                                                      const ShardOptions& shards, const GgufOptions& gguf) {
  std::vector<std::optional<std::string>> out;
  for (size_t i = 0; i < cp.tags.size(); ++i) {
    // A tag that serves gguf/ has nothing to say; only one without asks the view why.
    const bool served =
        std::ranges::any_of(views.at(i), [](const ViewFile& v) { return v.path.starts_with("gguf/"); });
    out.push_back(served ? std::nullopt : gguf_refusal(source, cp.tags[i], shards, gguf));
  }
  return out;
}

nlohmann::json describe_checkpoint(const Checkpoint& cp, bool with_tensors,
                                   const std::vector<std::vector<ViewFile>>& views,
                                   const std::vector<std::optional<std::string>>& gguf_refused,
                                   bool with_reads) {
  nlohmann::json j;
  j["source"] = cp.root.string();
  j["framework"] = cp.framework;
  j["latest"] = cp.latest;
  j["tags"] = nlohmann::json::array();
  for (size_t i = 0; i < cp.tags.size(); ++i) {
    const Tag& tag = cp.tags[i];
    const auto& t = tag.topology;
    nlohmann::json jt;
    jt["name"] = tag.name;
    jt["dir"] = tag.dir.string();
    jt["format"] = tag.format;
    jt["topology"] = {{"dp", t.dp},
                      {"tp", t.tp},
                      {"pp", t.pp},
                      {"ep", t.ep},
                      {"experts", t.experts},
                      {"optimizer", t.optimizer},
                      {"train_dtype", dtype_torch_name(t.train_dtype)}};
    if (tag.deepspeed) jt["topology"]["zero_stage"] = tag.deepspeed->zero_stage;  // ZeRO is DeepSpeed's
    jt["tensor_count"] = nlohmann::json::object();
    const auto catalogs = tag.named_catalogs();
    for (const auto& [name, c] : catalogs) jt["tensor_count"][name] = c->tensors.size();
    jt["views"] = nlohmann::json::array();
    for (const auto& v : summarize_views(views.at(i), with_reads)) {
      jt["views"].push_back({{"path", v.path}, {"size", v.bytes}, {"files", v.files}});
      if (v.source_bytes) jt["views"].back()["reads"] = *v.source_bytes;
    }
    jt["source_files"] = tag.files.size();
    jt["notes"] = tag.notes;
    if (const auto& why = gguf_refused.at(i)) jt["gguf_refused"] = *why;  // docs/formats/gguf.md
    if (with_tensors)
      for (const auto& [name, c] : catalogs) jt["tensors"][name] = describe_tensors(*c);
    j["tags"].push_back(std::move(jt));
  }
  j["left_out"] = nlohmann::json::array();
  for (const auto& l : cp.left_out) j["left_out"].push_back({{"tag", l.name}, {"error", l.error}});
  if (!cp.in_progress.empty()) j["in_progress"] = cp.in_progress;  // a live mount: saves not complete yet
  return j;
}

}  // namespace ckptfs
