// The general torch.save value writer: every kind the unpickler produces is written back so that
// unpickling gives the same tree (our unpickler here; torch.load in the end-to-end universal tests).
#include "views/torch_value.hpp"

#include <gtest/gtest.h>

#include "ckptfs/catalog.hpp"
#include "ckptfs/pickle.hpp"

namespace ckptfs::views {
namespace {

using pickle::Kind;
using pickle::make_value;
using pickle::ValuePtr;

ValuePtr text(Kind kind, std::string s) {
  auto v = make_value(kind);
  v->text = std::move(s);
  return v;
}

ValuePtr number(int64_t n) {
  auto v = make_value(Kind::Int);
  v->integer = n;
  return v;
}

// A tree with one of every kind, a subtree referenced twice and a tensor referenced twice.
ValuePtr sample(const catalog::TensorRef& tensor) {
  auto root = make_value(Kind::Dict);
  auto add = [&](std::string key, ValuePtr v) { root->entries.emplace_back(text(Kind::String, key), v); };
  add("none", make_value(Kind::None));
  auto t = make_value(Kind::Bool);
  t->boolean = true;
  add("bool", t);
  add("int", number(-70000));
  add("bigint", text(Kind::BigInt, std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9)));
  auto f = make_value(Kind::Float);
  f->real = 0.125;
  add("float", f);
  add("bytes", text(Kind::Bytes, std::string("\x00\xff\x80z", 4)));
  auto list = make_value(Kind::List);
  for (int i = 0; i < 1500; ++i) list->items.push_back(number(i));  // two APPENDS batches
  add("list", list);
  add("same list", list);
  auto tuple = make_value(Kind::Tuple);
  tuple->items = {number(1), number(2), number(3), number(4)};
  add("tuple", tuple);
  auto set = make_value(Kind::Set);
  set->items = {number(5)};
  add("set", set);
  auto od = make_value(Kind::Dict);
  od->module = "collections";
  od->name = "OrderedDict";
  od->entries.emplace_back(text(Kind::String, "k"), number(1));
  add("ordered", od);
  auto obj = make_value(Kind::Object);  // LossScaler-like: NEWOBJ + BUILD
  obj->module = "deepspeed.runtime.fp16.loss_scaler";
  obj->name = "LossScaler";
  obj->made_by_new = true;
  obj->args = make_value(Kind::Tuple);
  auto state = make_value(Kind::Dict);
  state->entries.emplace_back(text(Kind::String, "cur_scale"), f);
  obj->state = state;
  add("object", obj);
  auto en = make_value(Kind::Object);  // enum by value: REDUCE
  en->module = "deepspeed.runtime.zero.config";
  en->name = "ZeroStageEnum";
  en->args = make_value(Kind::Tuple);
  en->args->items = {number(2)};
  add("enum", en);
  auto tv = catalog::tensor_value(tensor, true);
  add("tensor", tv);
  add("same tensor", tv);
  return root;
}

const pickle::Value& at(const pickle::Value& dict, std::string_view key) {
  const pickle::Value* v = dict.find(key);
  EXPECT_NE(v, nullptr) << key;
  return *v;
}

// A tensor "w" [2, 3] in a catalog of its own.
catalog::TensorRef lone_tensor() {
  auto c = std::make_shared<catalog::Catalog>();
  c->tensors.emplace_back().name = "w";
  c->tensors.back().shape = {2, 3};
  return {c, 0};
}

TEST(TorchValue, EveryKindRoundTrips) {
  const catalog::TensorRef tensor = lone_tensor();
  const TorchPickle out = pickle_for_torch_save(*sample(tensor));
  ASSERT_EQ(out.storages.size(), 1u);  // one storage for the tensor referenced twice
  EXPECT_EQ(&*out.storages[0], &*tensor);

  std::vector<ValuePtr> pids;
  pickle::UnpickleOptions options;
  options.persistent_load = [&](const ValuePtr& pid) {
    pids.push_back(pid);
    return make_value(Kind::None);
  };
  const auto root = pickle::unpickle(std::as_bytes(std::span(out.data_pkl)), options);
  ASSERT_TRUE(root->is(Kind::Dict));
  EXPECT_TRUE(at(*root, "none").is(Kind::None));
  EXPECT_TRUE(at(*root, "bool").boolean);
  EXPECT_EQ(at(*root, "int").integer, -70000);
  EXPECT_EQ(at(*root, "bigint").text, std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9));
  EXPECT_EQ(at(*root, "float").real, 0.125);
  EXPECT_EQ(at(*root, "bytes").text, std::string("\x00\xff\x80z", 4));
  ASSERT_EQ(at(*root, "list").items.size(), 1500u);
  EXPECT_EQ(at(*root, "list").items[1499]->integer, 1499);
  EXPECT_EQ(&at(*root, "list"), &at(*root, "same list"));  // memo: one object
  EXPECT_EQ(at(*root, "tuple").items.size(), 4u);
  EXPECT_TRUE(at(*root, "set").is(Kind::Set));
  EXPECT_EQ(at(*root, "ordered").describe(), "collections.OrderedDict");
  EXPECT_EQ(at(*root, "ordered").entries.size(), 1u);
  const auto& obj = at(*root, "object");
  EXPECT_TRUE(obj.made_by_new);
  EXPECT_EQ(obj.name, "LossScaler");
  ASSERT_NE(obj.state, nullptr);
  EXPECT_EQ(obj.state->find("cur_scale")->real, 0.125);
  const auto& en = at(*root, "enum");
  EXPECT_FALSE(en.made_by_new);
  EXPECT_EQ(en.args->items[0]->integer, 2);
  // the tensor: _rebuild_tensor_v2(storage, 0, (2, 3), (3, 1), True, OrderedDict()), written once
  const auto& t = at(*root, "tensor");
  EXPECT_TRUE(t.is_global("torch._utils", "_rebuild_tensor_v2"));
  ASSERT_EQ(t.args->items.size(), 6u);
  EXPECT_EQ(t.args->items[2]->items.size(), 2u);
  EXPECT_EQ(t.args->items[3]->items[0]->integer, 3);
  EXPECT_TRUE(t.args->items[4]->boolean);  // requires_grad
  EXPECT_EQ(&t, &at(*root, "same tensor"));
  ASSERT_EQ(pids.size(), 1u);
  EXPECT_EQ(pids[0]->items[2]->text, "0");
  EXPECT_EQ(pids[0]->items[4]->integer, 6);
}

TEST(TorchValue, ShapeOverrideWritesAFlatView) {
  const catalog::TensorRef tensor = lone_tensor();
  const TorchPickle out =
      pickle_for_torch_save(*catalog::tensor_value(tensor, false, std::vector<int64_t>{6}));
  pickle::UnpickleOptions options;
  options.persistent_load = [](const ValuePtr&) { return make_value(Kind::None); };
  const auto root = pickle::unpickle(std::as_bytes(std::span(out.data_pkl)), options);
  ASSERT_EQ(root->args->items[2]->items.size(), 1u);
  EXPECT_EQ(root->args->items[2]->items[0]->integer, 6);
  EXPECT_FALSE(root->args->items[4]->boolean);
}

}  // namespace
}  // namespace ckptfs::views
