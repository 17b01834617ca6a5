// Python pickle reader (protocols 0-5) that never executes anything. Unknown globals become opaque
// Object values that keep their module, name, arguments and state, so DeepSpeed, Megatron, argparse or
// numpy objects can be read without those libraries. Every length, count, index and nesting depth is
// checked before use; malformed input throws FormatError (the caller prefixes the file name).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ckptfs/error.hpp"

// The natives a value may hold, each defined by the layer above that builds it: pickle, below them all,
// only declares them (it includes none of their headers) and never looks inside.
namespace ckptfs::torch {
struct StorageRef;    // a storage as a torch pickle names it (torch's persistent_load hook)
struct TensorObject;  // a tensor of a torch.save file (torch's reduce hook)
}  // namespace ckptfs::torch
namespace ckptfs::catalog {
struct TensorValue;  // a logical tensor placed in a value tree that views write
}  // namespace ckptfs::catalog

namespace ckptfs::pickle {

// What a Kind::Native value holds: one of a closed set, visited with ckptfs::Overloaded, never cast.
using Native =
    std::variant<std::shared_ptr<const torch::StorageRef>, std::shared_ptr<const torch::TensorObject>,
                 std::shared_ptr<const catalog::TensorValue>>;

// The pickle runs past the end of the given bytes: a caller reading a prefix of a longer stream (the
// legacy torch format) may retry with more bytes.
struct TruncatedError : FormatError {
  using FormatError::FormatError;
};

enum class Kind {
  None,
  Bool,
  Int,
  BigInt,
  Float,
  String,
  Bytes,
  Tuple,
  List,
  Dict,
  Set,
  FrozenSet,
  Global,  // a bare class/function reference (GLOBAL / STACK_GLOBAL not applied to anything)
  Object,  // the result of REDUCE/NEWOBJ/getattr on a global the unpickler does not model
  Native,  // a value built by a reduce hook (see UnpickleOptions::reduce)
};

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  Kind kind = Kind::None;
  bool boolean = false;
  int64_t integer = 0;          // Int
  double real = 0;              // Float
  std::string text;             // String (UTF-8), Bytes (raw), BigInt (two's complement, little-endian)
  std::vector<ValuePtr> items;  // Tuple, List, Set, FrozenSet; Object: APPENDs
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // Dict in insertion order; Object: SETITEMs
  // Global and Object: the callable or class. Dict: "collections.OrderedDict"; Tuple: "torch.Size" (set
  // by the torch reader, so that a writer can pickle the shape back as what it was).
  std::string module, name;
  std::string member;            // Object made by getattr(module.name, member) (enum members pickled by name)
  ValuePtr args;                 // Object: the argument tuple given to REDUCE / NEWOBJ
  ValuePtr state;                // Object and Dict: the BUILD state, kept apart from entries
  ValuePtr kwargs;               // Object made by NEWOBJ_EX: the keyword arguments
  bool made_by_new = false;      // Object made by NEWOBJ / NEWOBJ_EX (cls.__new__(cls, *args), no __init__)
  std::optional<Native> native;  // Native (and only Native): never null

  // Releases children iteratively, so destroying an arbitrarily deep tree never overflows the stack.
  ~Value();

  bool is(Kind k) const { return kind == k; }
  bool is_global(std::string_view mod, std::string_view nm) const {
    return (kind == Kind::Global || kind == Kind::Object) && module == mod && name == nm;
  }
  // Dict (or Object) entry whose key is the string `key`; nullptr when absent. The last entry wins (as
  // in a Python dict). An Object also looks in its BUILD state (a dict, or the (dict, slots) pair).
  const Value* find(std::string_view key) const;
  // Short description for error messages: "int", "dict", "deepspeed.runtime.zero.config.ZeroStageEnum"
  // (an Object made by getattr adds ".member"; a Native value: "storage" or "tensor").
  std::string describe() const;
};

inline ValuePtr make_value(Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

struct UnpickleOptions {
  size_t max_depth = 512;      // nesting of marks and containers
  size_t max_memo = 1u << 24;  // memo slots
  // Shared references (memo, DUP) let a small pickle describe a huge value: a list holding one list
  // twice, 60 levels deep, or set(x) / bytes(x) / torch.Size(x) on one large x a million times. Both what
  // the unpickler copies and the value with every shared subtree expanded are bounded by
  // max_expansion x the input size + 1 Mi units (a unit: one value, one item, 8 bytes of text).
  uint64_t max_expansion = 16;
  // BINPERSID / PERSID: maps the persistent id to a value. Without a callback persistent ids are an error.
  std::function<ValuePtr(const ValuePtr& pid)> persistent_load;
  // REDUCE / NEWOBJ on a global: return a value to push, or nullptr to let the unpickler build its
  // default (the builtins it models, else an opaque Object).
  std::function<ValuePtr(const Value& callable, const ValuePtr& args)> reduce;
  // What copying a native the hooks built costs, in the units of max_expansion (a tensor's shape and
  // strides); without a callback, 1.
  std::function<uint64_t(const Native& native)> native_weight;
};

// Unpickles one pickle from the start of `data`. `consumed`, when given, receives the number of bytes
// up to and including STOP (the legacy torch format concatenates several pickles). The result is a tree
// (shared subtrees allowed, cycles rejected) no deeper than max_depth and no larger, expanded, than
// max_expansion allows. Throws FormatError naming the
// opcode and byte offset; TruncatedError when the data ends before STOP.
ValuePtr unpickle(std::span<const std::byte> data, const UnpickleOptions& options = {},
                  size_t* consumed = nullptr);

}  // namespace ckptfs::pickle
