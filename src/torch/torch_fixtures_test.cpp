// Every torch.save file of the real DeepSpeed checkpoints, compared with the structure that torch.load
// gave when the fixtures were made (inventory.json).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "ckptfs/torch.hpp"

namespace ckptfs::torch {
namespace {

using pickle::Kind;
using pickle::Value;

const std::filesystem::path kFixtures =
    std::filesystem::path(CKPTFS_SOURCE_DIR) / "mount_tests/fixtures/deepspeed-real";

const Value* entry(const Value& v, const std::string& key) {
  if (const Value* found = v.find(key)) return found;
  for (const auto& [k, value] : v.entries)
    if (k->kind == Kind::Int && std::to_string(k->integer) == key) return value.get();
  return nullptr;
}

// A Python type name the inventory writes for a leaf whose value it does not record.
std::optional<Kind> python_type_kind(const std::string& name) {
  static const std::map<std::string, Kind> kinds = {
      {"float", Kind::Float}, {"int", Kind::Int},     {"bool", Kind::Bool}, {"NoneType", Kind::None},
      {"list", Kind::List},   {"tuple", Kind::Tuple}, {"dict", Kind::Dict}, {"bytes", Kind::Bytes}};
  auto it = kinds.find(name);
  return it == kinds.end() ? std::nullopt : std::optional(it->second);
}

// Appends to `problems` every place where `v` differs from the inventory's description `want`.
void compare(const Value& v, const nlohmann::json& want, const std::string& at,
             std::vector<std::string>& problems) {
  // Every leaf is checked for its kind as well as its value: a wrong kind is a problem, never a skip.
  const auto expect_kind = [&](Kind kind, const char* name) {
    if (v.kind == kind) return true;
    problems.push_back(fmt::format("{}: {} where the inventory has a {}", at, v.describe(), name));
    return false;
  };
  if (want.is_string()) {
    const std::string s = want;
    if (s.starts_with("Tensor[")) {
      const SourceTensor* t = as_tensor(v);
      if (!t) return problems.push_back(at + ": not a tensor");
      const std::string got =
          fmt::format("Tensor[{}][{}]", dtype_torch_name(t->dtype), fmt::join(t->shape, ", "));
      if (got != s) problems.push_back(fmt::format("{}: {} != {}", at, got, s));
    } else if (s.starts_with("torch.Size(")) {  // the repr of a shape
      const pickle::Value* seq =
          v.kind == Kind::Object && v.args && !v.args->items.empty() ? v.args->items[0].get() : &v;
      std::vector<int64_t> dims;
      for (const auto& item : seq->items) dims.push_back(item->integer);
      const std::string got = fmt::format("torch.Size([{}])", fmt::join(dims, ", "));
      if (got != s) problems.push_back(fmt::format("{}: {} != {}", at, got, s));
    } else if (auto kind = python_type_kind(s)) {  // the inventory names a leaf's type only
      expect_kind(*kind, s.c_str());
    } else if (expect_kind(Kind::String, "str") && v.text != s) {
      problems.push_back(fmt::format("{}: '{}' != '{}'", at, v.text, s));
    }
  } else if (want.is_boolean()) {
    if (expect_kind(Kind::Bool, "bool") && v.boolean != want.get<bool>())
      problems.push_back(at + ": bool differs");
  } else if (want.is_number_integer()) {
    // DeepSpeed's ZeroStageEnum is an IntEnum: the inventory (JSON) has its int value, the pickle the
    // enum member, by name (Python >= 3.11) or by value.
    static const std::map<std::string, int64_t> kZeroStages = {
        {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}};
    if (v.kind == Kind::Object && v.name == "ZeroStageEnum") {
      const auto by_name = kZeroStages.find(v.member);
      const int64_t got = by_name != kZeroStages.end()       ? by_name->second
                          : v.args && !v.args->items.empty() ? v.args->items[0]->integer
                                                             : -1;
      if (got != want.get<int64_t>()) problems.push_back(at + ": enum value differs");
    } else if (expect_kind(Kind::Int, "int") && v.integer != want.get<int64_t>()) {
      problems.push_back(at + ": int differs");
    }
  } else if (want.is_number_float()) {
    if (expect_kind(Kind::Float, "float") && v.real != want.get<double>())
      problems.push_back(at + ": float differs");
  } else if (want.is_null()) {
    expect_kind(Kind::None, "None");
  } else if (want.is_object()) {
    const std::string type = want.value("__type__", "");
    if (type == "list" || type == "tuple") {
      if (v.kind != Kind::List && v.kind != Kind::Tuple) return problems.push_back(at + ": not a list");
      if (v.items.size() != want["len"].get<size_t>()) return problems.push_back(at + ": length differs");
      const auto& items = want["items"];
      for (size_t i = 0; i < items.size() && i < v.items.size(); ++i)
        compare(*v.items[i], items[i], fmt::format("{}[{}]", at, i), problems);
      return;
    }
    // Python type names of values the reader models differently.
    const bool same_type = type == "dict" || v.describe() == type ||
                           (type == "builtins.set" && v.kind == Kind::Set) ||
                           (type == "torch.dtype" && v.kind == Kind::Global && v.module == "torch");
    if (!same_type) return problems.push_back(at + ": " + v.describe() + " != " + type);
    for (const auto& [key, child] : want.items()) {
      if (key == "__type__" || key == "repr") continue;  // repr: Python's text of a leaf
      const Value* found = entry(v, key);
      if (!found)
        problems.push_back(at + "." + key + ": missing");
      else
        compare(*found, child, at + "." + key, problems);
    }
  }
}

TEST(TorchFixtures, EveryFileMatchesItsInventory) {
  ASSERT_TRUE(std::filesystem::exists(kFixtures)) << kFixtures;
  size_t files = 0;
  for (const auto& dir : std::filesystem::directory_iterator(kFixtures)) {
    if (!dir.is_directory()) continue;
    const auto inventory = nlohmann::json::parse(std::ifstream(dir.path() / "inventory.json"));
    for (const auto& [name, info] : inventory.items()) {
      if (!info.contains("zip_root")) continue;
      SCOPED_TRACE(dir.path().filename().string() + "/" + name);
      auto archive = TorchArchive::open(io::File::open_standalone(dir.path() / name));
      std::vector<std::string> problems;
      compare(*archive.root(), info["structure"], "", problems);
      EXPECT_TRUE(problems.empty()) << fmt::format("{}", fmt::join(problems, "\n"));
      ++files;
    }
  }
  EXPECT_GT(files, 300u);
}

TEST(TorchFixtures, Bf16OptimizerStatesOfZero2) {
  const auto path =
      kFixtures / "z2_bf16_ws2/checkpoint/global_step3/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt";
  auto archive = TorchArchive::open(io::File::open_standalone(path));
  const Value* osd = archive.root()->find("optimizer_state_dict");
  ASSERT_NE(osd, nullptr);
  const Value* stage = osd->find("zero_stage");
  ASSERT_NE(stage, nullptr);
  EXPECT_TRUE(stage->is_global("deepspeed.runtime.zero.config", "ZeroStageEnum"));
  EXPECT_EQ(stage->member, "gradients");
  const Value* groups = osd->find("single_partition_of_fp32_groups");
  ASSERT_TRUE(groups && groups->kind == Kind::List && groups->items.size() == 1);
  const SourceTensor* t = as_tensor(*groups->items[0]);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::F32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{6042}));
  EXPECT_TRUE(t->is_contiguous());
  EXPECT_GE(t->storage.nbytes, 6042u * 4);
  EXPECT_EQ(t->storage.offset % 64, 0u);
  const Value* scaler = osd->find("loss_scaler");
  ASSERT_NE(scaler, nullptr);
  EXPECT_EQ(scaler->describe(), "deepspeed.runtime.fp16.loss_scaler.LossScaler");
  EXPECT_EQ(scaler->find("cur_scale")->real, 1.0);
  const Value* mappings = osd->find("param_slice_mappings");
  ASSERT_TRUE(mappings && !mappings->items.empty());
  EXPECT_EQ(mappings->items[0]->describe(), "collections.OrderedDict");
  const Value* fragment = mappings->items[0]->find("embed.weight");
  ASSERT_NE(fragment, nullptr);
  EXPECT_EQ(fragment->find("numel")->kind, Kind::Int);
}

}  // namespace
}  // namespace ckptfs::torch
