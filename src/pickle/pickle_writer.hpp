// A protocol-2 pickle emitter, opcode by opcode, with CPython's memo numbering: every memoised object gets
// BINPUT <next index> right after it, and a later use of the same object is a BINGET. What `torch.save`
// writes, so torch.load(weights_only=True) accepts the result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace ckptfs::pickle {

class PickleWriter {
 public:
  PickleWriter();  // PROTO 2

  void empty_dict();
  void mark();
  // A new str object (BINUNICODE, memoised).
  void string(std::string_view text);
  // The same str object at every call (a Python literal such as 'storage'): BINGET after the first time.
  void shared_string(std::string_view text);
  // A class or function: GLOBAL the first time, BINGET after.
  void global(std::string_view module, std::string_view name);
  void integer(int64_t value);  // BININT1 / BININT2 / BININT / LONG1, the shortest that fits
  // LONG1 / LONG4 of a little-endian two's complement integer (pickle::Value::text of a BigInt).
  void big_integer(std::string_view twos_complement);
  void boolean(bool value);
  void none();
  void real(double value);  // BINFLOAT
  void empty_list();        // memoised
  // Appends `count` items to the list (or object) on the stack, in batches of 1000 (APPENDS / APPEND).
  void append_items(size_t count, const std::function<void(size_t)>& write_item);
  // A tuple of n items: call begin_tuple, write the items, call end_tuple (MARK ... TUPLE for more than
  // three items, TUPLE1-3 otherwise, EMPTY_TUPLE for none; memoised unless empty).
  void begin_tuple(size_t n);
  void end_tuple(size_t n);
  void reduce();         // REDUCE, memoising the result
  void new_object();     // NEWOBJ (cls.__new__(cls, *args)), memoising the result
  void build();          // BUILD: sets the state on the object below it
  void persistent_id();  // BINPERSID: the object on the stack is a persistent id
  // BINGET / LONG_BINGET of memo slot `index`; memo_index() is the slot of the last memoised object.
  void get(uint32_t index);
  uint32_t memo_index() const { return memo_size_ - 1; }
  // Adds `count` key/value pairs to the dict on the stack, in batches of 1000 as CPython does:
  // write_item(i) writes the i-th key then value.
  void set_items(size_t count, const std::function<void(size_t)>& write_item);

  std::string finish() &&;  // STOP

 private:
  void memoize();
  // BINGET of the object remembered under `key`; false when it is new (and is now remembered).
  bool get_shared(std::string key);
  void put_le(uint64_t value, int bytes);
  // CPython's _batch_appends / _batch_setitems: MARK ... `many` per 1000, `one` for a lone item.
  void batched(size_t count, const std::function<void(size_t)>& write_item, uint8_t one, uint8_t many);

  std::string out_;
  uint32_t memo_size_ = 0;
  std::map<std::string, uint32_t, std::less<>> shared_;
};

}  // namespace ckptfs::pickle
