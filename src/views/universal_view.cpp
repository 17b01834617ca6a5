// universal/: a DeepSpeed universal checkpoint (docs/formats/universal.md) laid out from a tag's
// UniversalPlan, in the zip layout of DeepSpeed's own files (torch 1.13's records). One directory per
// trainable parameter with a few small torch.save files each: tens of thousands of files for a large model,
// so each file keeps only its indices and builds its zip layout when opened (open_layout: the mount's reads
// go to that layout) or, read without an open (export), per read (a few microseconds, nothing next to the
// tensor bytes it serves).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>

#include "ckptfs/error.hpp"
#include "ckptfs/layout.hpp"
#include "views/torch_value.hpp"

namespace ckptfs::views {

namespace {

constexpr size_t kStep = SIZE_MAX;  // `what` of a step.pt
constexpr size_t kFp32 = SIZE_MAX - 1;

pickle::ValuePtr text_value(std::string text) {
  auto v = pickle::make_value(pickle::Kind::String);
  v->text = std::move(text);
  return v;
}

// zero/<param>/<stem>.pt: fp32 masters (kFp32), optimizer state key `what`, or the step (kStep).
class UniversalParamFile final : public VirtualFile {
 public:
  // Files of the same layout (stem, dtype, shape, the dict's keys before 'param') have the same size:
  // `sizes` remembers it, so a tree of hundreds of thousands of files builds a few layouts, not one per file.
  UniversalParamFile(std::shared_ptr<const UniversalPlan> plan, size_t param, size_t what,
                     std::unordered_map<std::string, uint64_t>& sizes)
      : plan_(std::move(plan)), param_(param), what_(what) {
    const catalog::TensorRef t = tensor();
    if (!t) {  // a step kept as a plain number
      size_ = build()->size();
      return;
    }
    std::string layout =
        fmt::format("{}|{}|{}", stem(), dtype_torch_name(t->dtype), fmt::join(t->shape, ","));
    const UniversalParam& p = plan_->params[param_];
    if (p.merge_keys)
      for (const auto& [key, value] : *p.merge_keys)
        layout += fmt::format(
            "|{}={}", key, value->is(pickle::Kind::Int) ? std::to_string(value->integer) : value->describe());
    auto [it, inserted] = sizes.try_emplace(layout, 0);
    if (inserted) it->second = build()->size();
    size_ = it->second;
  }

  uint64_t size() const override { return size_; }
  void read(uint64_t offset, std::span<std::byte> dst) const override { build()->read(offset, dst); }
  void prefetch(uint64_t offset, uint64_t length) const override { build()->prefetch(offset, length); }
  VirtualFilePtr open_layout() const override { return build(); }
  void append_source_runs(std::vector<catalog::Piece>& out) const override {
    if (const catalog::TensorRef t = tensor()) catalog::append_runs(*t, 0, t->numel(), out);
  }
  std::vector<io::FilePtr> sources() const override {
    const catalog::TensorRef t = tensor();
    return t ? distinct_sources(std::span(&t, 1)) : std::vector<io::FilePtr>{};
  }

  // The tensor the file holds; none for a step that is a plain number.
  catalog::TensorRef tensor() const {
    const UniversalParam& p = plan_->params[param_];
    if (what_ == kFp32) return p.fp32;
    if (what_ != kStep) return p.state[what_];
    const pickle::Value* v = p.step.get();
    const auto* step = v ? catalog::as_tensor_value(*v) : nullptr;
    return step ? step->tensor : catalog::TensorRef{};
  }

  std::string stem() const {
    return what_ == kStep ? "step" : what_ == kFp32 ? "fp32" : plan_->state_keys[what_];
  }

 private:
  // What torch.load returns: {'cat_dim': 0, 'param': T} (ZeRO-0/1/2), a bare 1-D tensor (ZeRO-3), or the
  // group's step. fp32 masters require grad, as DeepSpeed's do when it saves them.
  pickle::ValuePtr value() const {
    const UniversalParam& p = plan_->params[param_];
    if (what_ == kStep) return p.step;
    const catalog::TensorRef& t = what_ == kFp32 ? p.fp32 : p.state[what_];
    const bool requires_grad = what_ == kFp32;
    if (plan_->bare_tensors)
      return catalog::tensor_value(t, requires_grad, std::vector<int64_t>{static_cast<int64_t>(t->numel())});
    auto dict = pickle::make_value(pickle::Kind::Dict);
    if (p.merge_keys) {
      for (const auto& [key, value] : *p.merge_keys) dict->entries.emplace_back(text_value(key), value);
    } else {
      dict->entries.emplace_back(text_value("cat_dim"), pickle::make_value(pickle::Kind::Int));
    }
    dict->entries.emplace_back(text_value("param"), catalog::tensor_value(t, requires_grad));
    return dict;
  }

  VirtualFilePtr build() const { return make_torch_save_value(*value(), stem(), ZipRecords::torch_1_13); }

  std::shared_ptr<const UniversalPlan> plan_;
  size_t param_, what_;
  uint64_t size_;
};

// A parameter name becomes one directory name.
void require_directory_name(const std::string& name, const Tag& tag) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    throw FormatError(
        fmt::format("{}: parameter name '{}' cannot be a directory of universal/", tag.dir.string(), name));
}

}  // namespace

std::vector<ViewFile> universal_views(const io::Source& source, const Tag& tag) {
  std::vector<ViewFile> out;
  const auto plan = tag.universal();
  if (!plan) return out;
  const std::string dir = fmt::format("universal/{}_universal", tag.name);
  out.push_back({"universal/latest_universal", make_bytes_file(tag.name + "_universal")});
  for (const auto& path : plan->model_state_files)
    out.push_back({fmt::format("{}/{}", dir, path.filename().string()), make_passthrough(source.open(path))});
  out.push_back({dir + "/zero/optimizer_state.pt",
                 make_torch_save_value(*plan->optimizer_state, "optimizer_state", ZipRecords::torch_1_13)});
  std::unordered_map<std::string, uint64_t> sizes;
  for (size_t i = 0; i < plan->params.size(); ++i) {
    const UniversalParam& p = plan->params[i];
    require_directory_name(p.name, tag);
    std::vector<size_t> files = {kFp32};
    for (size_t k = 0; k < plan->state_keys.size(); ++k) files.push_back(k);
    if (p.step) files.push_back(kStep);
    for (size_t what : files) {
      auto file = std::make_shared<UniversalParamFile>(plan, i, what, sizes);
      out.push_back({fmt::format("{}/zero/{}/{}.pt", dir, p.name, file->stem()), std::move(file)});
    }
  }
  return out;
}

}  // namespace ckptfs::views
