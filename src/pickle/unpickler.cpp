// The pickle virtual machine: a stack of values, a stack of marks and a memo, driven by opcodes. It builds
// values only; callables are never called (see builtins.cpp for the few it models).
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckptfs/error.hpp"
#include "ckptfs/pickle.hpp"
#include "pickle/builtins.hpp"
#include "pickle/integers.hpp"
#include "pickle/opcodes.hpp"
#include "pickle/strings.hpp"
#include "pickle/structure_check.hpp"

namespace ckptfs::pickle {

namespace {

ValuePtr make_int(int64_t i) {
  auto v = make_value(Kind::Int);
  v->integer = i;
  return v;
}

ValuePtr make_bool(bool b) {
  auto v = make_value(Kind::Bool);
  v->boolean = b;
  return v;
}

ValuePtr make_text(Kind kind, std::string text) {
  auto v = make_value(kind);
  v->text = std::move(text);
  return v;
}

ValuePtr make_sequence(Kind kind, std::vector<ValuePtr> items) {
  auto v = make_value(kind);
  v->items = std::move(items);
  return v;
}

ValuePtr make_global(std::string module, std::string name) {
  auto v = make_value(Kind::Global);
  v->module = std::move(module);
  v->name = std::move(name);
  return v;
}

class Unpickler {
 public:
  Unpickler(std::span<const std::byte> data, const UnpickleOptions& options)
      : data_(data), opt_(options), max_weight_(max_weight(data.size(), options.max_expansion)) {}

  ValuePtr run(size_t* consumed) {
    try {
      while (true) {
        op_pos_ = pos_;
        op_ = u8();
        if (op_ == op::STOP) break;
        try {
          step();
        } catch (const TruncatedError&) {
          throw;
        } catch (const FormatError& e) {
          if (in_hook_) fail(e.what());  // a hook's error gets the opcode and offset
          throw;
        }
      }
      ValuePtr result = pop();
      std::unordered_set<const Value*> kept;
      if (auto problem = check_structure(*result, opt_.max_depth, max_weight_, opt_.native_weight, &kept))
        fail(*problem);
      // The result is a tree; values the pickle built and dropped may still hold each other in a
      // cycle (a dict set into itself, then popped), which only cutting their links frees.
      break_cycles(&kept);
      if (consumed) *consumed = pos_;
      return result;
    } catch (...) {
      break_cycles(nullptr);
      throw;
    }
  }

 private:
  static uint64_t max_weight(size_t data_size, uint64_t expansion) {
    constexpr uint64_t kBase = 1 << 20, kCap = uint64_t{1} << 60;
    return data_size > 0 && expansion > (kCap - kBase) / data_size ? kCap : kBase + expansion * data_size;
  }

  // Calls (the reduce hook, modelled builtins) and STACK_GLOBAL copy what their arguments hold, down to
  // the items of an argument's items (_rebuild_from_type_v2's inner shape); a memoized argument used over
  // and over would make that unbounded, so the copies draw on the expansion budget. The time spent here
  // is proportional to the charge.
  uint64_t weight_within(const Value& v, int levels) const {
    uint64_t w = shallow_weight(v, opt_.native_weight);
    if (levels > 0)
      for (const auto& item : v.items) w += weight_within(*item, levels - 1);
    return w;
  }
  void charge(const Value& v, int levels) {
    copied_ += weight_within(v, levels);
    if (copied_ > max_weight_)
      fail(fmt::format("arguments copied add up to more than {} units (shared references repeated)",
                       max_weight_));
  }

  [[noreturn]] void fail(std::string_view problem) const {
    auto name = op::name(op_);
    if (name.empty()) throw FormatError(fmt::format("pickle: byte {}: {}", op_pos_, problem));
    throw FormatError(fmt::format("pickle: {} at byte {}: {}", name, op_pos_, problem));
  }

  // Every read goes through here, so no length is used before it is checked against the data left.
  std::span<const std::byte> take(uint64_t n) {
    if (n > data_.size() - pos_) {
      auto name = op::name(op_);
      throw TruncatedError(fmt::format("pickle: {} at byte {}: needs {} bytes, {} left (truncated data)",
                                       name.empty() ? "opcode" : name, op_pos_, n, data_.size() - pos_));
    }
    auto out = data_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }

  template <typename T>
  T little_endian() {
    auto bytes = take(sizeof(T));
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(std::to_integer<T>(bytes[i]) << (8 * i));
    return v;
  }
  uint8_t u8() { return little_endian<uint8_t>(); }
  uint16_t u16() { return little_endian<uint16_t>(); }
  uint32_t u32() { return little_endian<uint32_t>(); }
  uint64_t u64() { return little_endian<uint64_t>(); }

  std::string_view bytes_text(uint64_t n) {
    auto bytes = take(n);
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }

  // One protocol-0 text argument: the bytes up to the next newline (consumed, not returned).
  std::string_view line() {
    auto rest = data_.subspan(pos_);
    const auto nl = std::find(rest.begin(), rest.end(), std::byte{'\n'});
    if (nl == rest.end()) take(rest.size() + 1);  // throws TruncatedError
    auto text = bytes_text(static_cast<uint64_t>(nl - rest.begin()));
    take(1);
    return text;
  }

  uint64_t decimal_index(std::string_view text) const {
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size()) fail(fmt::format("bad memo index '{}'", text));
    return v;
  }

  // Stack access is limited to the current frame (above the innermost mark), as in CPython.
  size_t frame_base() const { return marks_.empty() ? 0 : marks_.back(); }
  void need(size_t n) const {
    if (stack_.size() - frame_base() < n) fail(fmt::format("needs {} values on the stack", n));
  }
  ValuePtr pop() {
    need(1);
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  const ValuePtr& top() const {
    need(1);
    return stack_.back();
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    std::vector<ValuePtr> items(
        std::make_move_iterator(stack_.begin() + static_cast<ptrdiff_t>(marks_.back())),
        std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }

  // Picklers number memo slots 0, 1, 2, ...: those live in a vector; an index far beyond the ones seen
  // (only a hand-made pickle does that) goes to a map, so it cannot make the vector huge.
  ValuePtr* memo_slot(uint64_t index, bool create) {
    if (index < memo_dense_.size())
      return memo_dense_[index] ? &memo_dense_[index] : create ? &memo_dense_[index] : nullptr;
    if (create && index < memo_dense_.size() * 2 + 1024) {
      memo_dense_.resize(index + 1);
      return &memo_dense_[index];
    }
    auto it = memo_sparse_.find(index);
    if (it != memo_sparse_.end()) return &it->second;
    return create ? &memo_sparse_[index] : nullptr;
  }
  void memo_put(uint64_t index) {
    const ValuePtr& v = top();
    ValuePtr* slot = memo_slot(index, false);
    if (slot == nullptr) {
      if (memo_count_ >= opt_.max_memo) fail(fmt::format("more than {} memo entries", opt_.max_memo));
      ++memo_count_;
      slot = memo_slot(index, true);
    }
    *slot = v;
  }
  void memo_get(uint64_t index) {
    const ValuePtr* slot = memo_slot(index, false);
    if (slot == nullptr) fail(fmt::format("memo index {} was never stored", index));
    push(*slot);
  }

  void push_int(std::string_view text) {
    auto parsed = parse_decimal_int(text);
    if (!parsed) fail(fmt::format("bad integer text '{:.40}'", text));
    if (auto* small = std::get_if<int64_t>(&*parsed)) return push(make_int(*small));
    push(make_text(Kind::BigInt, std::move(std::get<std::string>(*parsed))));
  }

  void push_long(std::span<const std::byte> bytes) {
    if (auto small = int64_from_twos_complement(bytes)) return push(make_int(*small));
    push(make_text(Kind::BigInt, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  }

  void push_float(std::string_view text) {
    if (!text.empty() && text[0] == '+') text.remove_prefix(1);
    double d = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
    if (ec != std::errc{} || end != text.data() + text.size())
      fail(fmt::format("bad float text '{:.40}'", text));
    auto v = make_value(Kind::Float);
    v->real = d;
    push(std::move(v));
  }

  void push_unicode(std::string_view text) {
    if (!is_utf8(text)) fail("string is not valid UTF-8");
    push(make_text(Kind::String, std::string(text)));
  }

  // Python 2 str: text when it is UTF-8 (what torch.load's encoding='utf-8' gives), else raw bytes.
  void push_py2_string(std::string_view text) {
    push(make_text(is_utf8(text) ? Kind::String : Kind::Bytes, std::string(text)));
  }

  void push_tuple(size_t n) {
    need(n);
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.end() - static_cast<ptrdiff_t>(n)),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    push(make_sequence(Kind::Tuple, std::move(items)));
  }

  // `callable(*args)` (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ): the reduce hook's value, a modelled builtin,
  // or an opaque Object that remembers the call.
  ValuePtr construct(const ValuePtr& callable, const ValuePtr& args) {
    if (callable->kind != Kind::Global && callable->kind != Kind::Object)
      fail(fmt::format("cannot call a {}", callable->describe()));
    if (args->kind != Kind::Tuple) fail(fmt::format("arguments are a {}, not a tuple", args->describe()));
    charge(*callable, 0);
    charge(*args, 2);
    if (callable->kind == Kind::Global) {
      in_hook_ = true;
      ValuePtr built = opt_.reduce ? opt_.reduce(*callable, args) : nullptr;
      if (!built) built = construct_builtin(*callable, args);
      in_hook_ = false;
      if (built) return built;
    }
    auto obj = make_value(Kind::Object);
    obj->module = callable->module;
    obj->name = callable->name;
    obj->member = callable->member;
    obj->args = args;
    return obj;
  }

  ValuePtr persistent(const ValuePtr& pid) {
    if (!opt_.persistent_load) fail("persistent id without a persistent_load handler");
    charge(*pid, 2);
    in_hook_ = true;
    ValuePtr v = opt_.persistent_load(pid);
    in_hook_ = false;
    if (!v) fail("persistent_load returned no value");
    return v;
  }

  // Cycles can only be made by adding to a value that already exists; on failure those values are emptied
  // so that nothing leaks.
  void mutating(const ValuePtr& target) {
    if (mutated_.empty() || mutated_.back().lock() != target) mutated_.push_back(target);
  }
  // Cuts the links of every value the pickle mutated (its items, entries, state), except those in
  // `keep` (the result's own containers).
  void break_cycles(const std::unordered_set<const Value*>* keep) {
    for (const auto& weak : mutated_) {
      if (auto v = weak.lock(); v && !(keep && keep->contains(v.get()))) {
        Value sink;  // its destructor releases the children iteratively
        std::swap(sink.items, v->items);
        std::swap(sink.entries, v->entries);
        std::swap(sink.state, v->state);
      }
    }
  }

  void set_items(const ValuePtr& target_ptr, std::vector<ValuePtr>& kv) {
    Value& target = *target_ptr;
    mutating(target_ptr);
    if (kv.size() % 2 != 0) fail("odd number of values for key/value pairs");
    if (target.kind != Kind::Dict && target.kind != Kind::Object)
      fail(fmt::format("cannot set items on a {}", target.describe()));
    for (size_t i = 0; i < kv.size(); i += 2)
      target.entries.emplace_back(std::move(kv[i]), std::move(kv[i + 1]));
  }

  void append_items(const ValuePtr& target_ptr, std::vector<ValuePtr>& items, bool to_set) {
    Value& target = *target_ptr;
    mutating(target_ptr);
    const bool ok = target.kind == Kind::Object || target.kind == (to_set ? Kind::Set : Kind::List);
    if (!ok) fail(fmt::format("cannot add items to a {}", target.describe()));
    for (auto& item : items) target.items.push_back(std::move(item));
  }

  void build() {
    ValuePtr state = pop();
    const ValuePtr& target = top();
    mutating(target);
    if (target->kind != Kind::Object && target->kind != Kind::Dict && target->kind != Kind::Native)
      fail(fmt::format("cannot set state on a {}", target->describe()));
    target->state = std::move(state);  // OrderedDict state stays apart from its entries
  }

  void step() {
    using namespace op;
    switch (op_) {
      case PROTO:
        if (int proto = u8(); proto > kHighestProtocol) fail(fmt::format("unsupported protocol {}", proto));
        return;
      case FRAME:
        // Only a read-ahead hint; the length must still fit in the data.
        if (uint64_t n = u64(); n > data_.size() - pos_) take(n);
        return;
      case MARK:
        if (marks_.size() >= opt_.max_depth) fail(fmt::format("marks nested deeper than {}", opt_.max_depth));
        marks_.push_back(stack_.size());
        return;
      case POP:
        if (stack_.size() == frame_base() && !marks_.empty()) {
          marks_.pop_back();
        } else {
          pop();
        }
        return;
      case POP_MARK:
        pop_mark();
        return;
      case DUP:
        push(top());
        return;

      case NONE:
        return push(make_value(Kind::None));
      case NEWTRUE:
        return push(make_bool(true));
      case NEWFALSE:
        return push(make_bool(false));
      case INT: {
        auto text = line();
        if (text == "01" || text == "00") return push(make_bool(text == "01"));  // protocol-0 bools
        return push_int(text);
      }
      case LONG: {
        auto text = line();
        if (!text.empty() && text.back() == 'L') text.remove_suffix(1);
        return push_int(text);
      }
      case BININT:
        return push(make_int(static_cast<int32_t>(u32())));
      case BININT1:
        return push(make_int(u8()));
      case BININT2:
        return push(make_int(u16()));
      case LONG1:
        return push_long(take(u8()));
      case LONG4: {
        auto n = static_cast<int32_t>(u32());
        if (n < 0) fail("negative length");
        return push_long(take(static_cast<uint64_t>(n)));
      }
      case FLOAT:
        return push_float(line());
      case BINFLOAT: {
        auto bytes = take(8);
        uint64_t bits = 0;
        for (auto b : bytes) bits = (bits << 8) | std::to_integer<uint64_t>(b);  // big-endian
        auto v = make_value(Kind::Float);
        v->real = std::bit_cast<double>(bits);
        return push(std::move(v));
      }

      case STRING: {
        auto text = line();
        if (text.size() < 2 || text.front() != text.back() || (text.front() != '\'' && text.front() != '"'))
          fail("string argument is not quoted");
        auto decoded = decode_escaped_bytes(text.substr(1, text.size() - 2));
        if (!decoded) fail("bad escape in string");
        return push_py2_string(*decoded);
      }
      case BINSTRING: {
        auto n = static_cast<int32_t>(u32());
        if (n < 0) fail("negative length");
        return push_py2_string(bytes_text(static_cast<uint64_t>(n)));
      }
      case SHORT_BINSTRING:
        return push_py2_string(bytes_text(u8()));
      case UNICODE: {
        auto decoded = decode_raw_unicode_escape(line());
        if (!decoded) fail("bad \\u escape in text");
        return push(make_text(Kind::String, std::move(*decoded)));
      }
      case SHORT_BINUNICODE:
        return push_unicode(bytes_text(u8()));
      case BINUNICODE:
        return push_unicode(bytes_text(u32()));
      case BINUNICODE8:
        return push_unicode(bytes_text(u64()));
      case SHORT_BINBYTES:
        return push(make_text(Kind::Bytes, std::string(bytes_text(u8()))));
      case BINBYTES:
        return push(make_text(Kind::Bytes, std::string(bytes_text(u32()))));
      case BINBYTES8:
      case BYTEARRAY8:
        return push(make_text(Kind::Bytes, std::string(bytes_text(u64()))));
      case NEXT_BUFFER:
      case READONLY_BUFFER:
        fail("out-of-band buffers not supported");

      case EMPTY_TUPLE:
        return push(make_value(Kind::Tuple));
      case TUPLE1:
        return push_tuple(1);
      case TUPLE2:
        return push_tuple(2);
      case TUPLE3:
        return push_tuple(3);
      case TUPLE:
        return push(make_sequence(Kind::Tuple, pop_mark()));
      case EMPTY_LIST:
        return push(make_value(Kind::List));
      case LIST:
        return push(make_sequence(Kind::List, pop_mark()));
      case EMPTY_DICT:
        return push(make_value(Kind::Dict));
      case DICT: {
        auto kv = pop_mark();
        auto dict = make_value(Kind::Dict);
        set_items(dict, kv);
        return push(std::move(dict));
      }
      case EMPTY_SET:
        return push(make_value(Kind::Set));
      case FROZENSET:
        return push(make_sequence(Kind::FrozenSet, pop_mark()));
      case APPEND: {
        std::vector<ValuePtr> item{pop()};
        return append_items(top(), item, false);
      }
      case APPENDS: {
        auto items = pop_mark();
        return append_items(top(), items, false);
      }
      case ADDITEMS: {
        auto items = pop_mark();
        return append_items(top(), items, true);
      }
      case SETITEM: {
        need(3);
        std::vector<ValuePtr> kv(std::make_move_iterator(stack_.end() - 2),
                                 std::make_move_iterator(stack_.end()));
        stack_.resize(stack_.size() - 2);
        return set_items(top(), kv);
      }
      case SETITEMS: {
        auto kv = pop_mark();
        return set_items(top(), kv);
      }

      case GET:
        return memo_get(decimal_index(line()));
      case BINGET:
        return memo_get(u8());
      case LONG_BINGET:
        return memo_get(u32());
      case PUT:
        return memo_put(decimal_index(line()));
      case BINPUT:
        return memo_put(u8());
      case LONG_BINPUT:
        return memo_put(u32());
      case MEMOIZE:
        return memo_put(memo_count_);

      case GLOBAL: {
        std::string module(line());
        std::string name(line());
        return push(make_global(std::move(module), std::move(name)));
      }
      case STACK_GLOBAL: {
        ValuePtr name = pop(), module = pop();
        if (module->kind != Kind::String || name->kind != Kind::String)
          fail("module and name must be strings");
        charge(*module, 0);
        charge(*name, 0);
        return push(make_global(module->text, name->text));
      }
      case EXT1:
      case EXT2:
      case EXT4: {
        uint32_t code = op_ == EXT1 ? u8() : op_ == EXT2 ? u16() : u32();
        fail(fmt::format("extension registry code {} (copyreg.add_extension) not supported", code));
      }
      case REDUCE:
      case NEWOBJ: {
        ValuePtr args = pop(), callable = pop();
        ValuePtr obj = construct(callable, args);
        if (obj->kind == Kind::Object) obj->made_by_new = op_ == NEWOBJ;
        return push(std::move(obj));
      }
      case NEWOBJ_EX: {
        ValuePtr kwargs = pop(), args = pop(), cls = pop();
        ValuePtr obj = construct(cls, args);
        if (obj->kind == Kind::Object) obj->made_by_new = true;
        if (obj->kind == Kind::Object && !(kwargs->kind == Kind::Dict && kwargs->entries.empty()))
          obj->kwargs = std::move(kwargs);
        return push(std::move(obj));
      }
      case INST: {
        std::string module(line());
        std::string name(line());
        auto args = make_sequence(Kind::Tuple, pop_mark());
        return push(construct(make_global(std::move(module), std::move(name)), args));
      }
      case OBJ: {
        auto items = pop_mark();
        if (items.empty()) fail("no class given");
        ValuePtr cls = std::move(items.front());
        items.erase(items.begin());
        return push(construct(cls, make_sequence(Kind::Tuple, std::move(items))));
      }
      case BUILD:
        return build();

      case PERSID:
        return push(persistent(make_text(Kind::String, std::string(line()))));
      case BINPERSID: {
        ValuePtr pid = pop();
        return push(persistent(pid));
      }
      default:
        fail(fmt::format("unknown opcode 0x{:02x}", op_));
    }
  }

  std::span<const std::byte> data_;
  const UnpickleOptions& opt_;
  const uint64_t max_weight_;
  uint64_t copied_ = 0;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  bool in_hook_ = false;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;  // stack sizes at each MARK
  std::vector<ValuePtr> memo_dense_;
  std::unordered_map<uint64_t, ValuePtr> memo_sparse_;
  size_t memo_count_ = 0;  // slots stored (MEMOIZE stores at this index)
  std::vector<std::weak_ptr<Value>> mutated_;
};

}  // namespace

ValuePtr unpickle(std::span<const std::byte> data, const UnpickleOptions& options, size_t* consumed) {
  return Unpickler(data, options).run(consumed);
}

}  // namespace ckptfs::pickle
