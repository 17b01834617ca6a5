#include "pickle/pickle_writer.hpp"

#include <cstring>

#include "pickle/opcodes.hpp"

namespace ckptfs::pickle {

namespace {
constexpr size_t kBatchSize = 1000;  // pickle.Pickler._BATCHSIZE
}

PickleWriter::PickleWriter() {
  out_.push_back(static_cast<char>(op::PROTO));
  out_.push_back(2);
}

void PickleWriter::put_le(uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>(value >> (8 * i)));
}

void PickleWriter::memoize() {
  if (memo_size_ < 256) {
    out_.push_back(op::BINPUT);
    put_le(memo_size_, 1);
  } else {
    out_.push_back(op::LONG_BINPUT);
    put_le(memo_size_, 4);
  }
  ++memo_size_;
}

void PickleWriter::get(uint32_t index) {
  if (index < 256) {
    out_.push_back(op::BINGET);
    put_le(index, 1);
  } else {
    out_.push_back(op::LONG_BINGET);
    put_le(index, 4);
  }
}

bool PickleWriter::get_shared(std::string key) {
  auto [it, inserted] = shared_.try_emplace(std::move(key), memo_size_);
  if (inserted) return false;
  get(it->second);
  return true;
}

void PickleWriter::empty_dict() {
  out_.push_back(op::EMPTY_DICT);
  memoize();
}

void PickleWriter::mark() {
  out_.push_back(op::MARK);
}

void PickleWriter::string(std::string_view text) {
  out_.push_back(op::BINUNICODE);
  put_le(text.size(), 4);
  out_ += text;
  memoize();
}

void PickleWriter::shared_string(std::string_view text) {
  if (!get_shared("s" + std::string(text))) string(text);
}

void PickleWriter::global(std::string_view module, std::string_view name) {
  const std::string line = std::string(module) + "\n" + std::string(name) + "\n";
  if (get_shared("g" + line)) return;
  out_.push_back(op::GLOBAL);
  out_ += line;
  memoize();
}

void PickleWriter::integer(int64_t value) {
  if (value >= 0 && value <= 0xFF) {
    out_.push_back(op::BININT1);
    put_le(static_cast<uint64_t>(value), 1);
  } else if (value >= 0 && value <= 0xFFFF) {
    out_.push_back(op::BININT2);
    put_le(static_cast<uint64_t>(value), 2);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out_.push_back(op::BININT);
    put_le(static_cast<uint64_t>(value), 4);
  } else {
    // Minimal little-endian two's complement: drop top bytes that only repeat the sign.
    int n = 8;
    while (n > 1) {
      const int64_t top = value >> (8 * (n - 1));  // arithmetic shift: 0 or -1 when redundant
      const bool next_negative = (value >> (8 * (n - 1) - 1)) & 1;
      if (!((top == 0 && !next_negative) || (top == -1 && next_negative))) break;
      --n;
    }
    out_.push_back(static_cast<char>(op::LONG1));
    put_le(static_cast<uint64_t>(n), 1);
    put_le(static_cast<uint64_t>(value), n);
  }
}

void PickleWriter::big_integer(std::string_view twos_complement) {
  if (twos_complement.size() < 256) {
    out_.push_back(static_cast<char>(op::LONG1));
    put_le(twos_complement.size(), 1);
  } else {
    out_.push_back(static_cast<char>(op::LONG4));
    put_le(twos_complement.size(), 4);
  }
  out_ += twos_complement;
}

void PickleWriter::none() {
  out_.push_back(op::NONE);
}

void PickleWriter::real(double value) {
  out_.push_back(op::BINFLOAT);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>(bits >> (8 * i)));  // big-endian
}

void PickleWriter::empty_list() {
  out_.push_back(op::EMPTY_LIST);
  memoize();
}

void PickleWriter::append_items(size_t count, const std::function<void(size_t)>& write_item) {
  batched(count, write_item, op::APPEND, op::APPENDS);
}

void PickleWriter::batched(size_t count, const std::function<void(size_t)>& write_item, uint8_t one,
                           uint8_t many) {
  for (size_t begin = 0; begin < count; begin += kBatchSize) {
    const size_t end = std::min(count, begin + kBatchSize);
    if (end - begin > 1) mark();
    for (size_t i = begin; i < end; ++i) write_item(i);
    out_.push_back(static_cast<char>(end - begin > 1 ? many : one));
  }
}

void PickleWriter::boolean(bool value) {
  out_.push_back(static_cast<char>(value ? op::NEWTRUE : op::NEWFALSE));
}

void PickleWriter::begin_tuple(size_t n) {
  if (n > 3) mark();
}

void PickleWriter::end_tuple(size_t n) {
  static constexpr uint8_t kSmall[] = {op::EMPTY_TUPLE, op::TUPLE1, op::TUPLE2, op::TUPLE3};
  out_.push_back(static_cast<char>(n <= 3 ? kSmall[n] : uint8_t{op::TUPLE}));
  if (n > 0) memoize();
}

void PickleWriter::reduce() {
  out_.push_back(op::REDUCE);
  memoize();
}

void PickleWriter::new_object() {
  out_.push_back(static_cast<char>(op::NEWOBJ));
  memoize();
}

void PickleWriter::build() {
  out_.push_back(op::BUILD);
}

void PickleWriter::persistent_id() {
  out_.push_back(op::BINPERSID);
}

void PickleWriter::set_items(size_t count, const std::function<void(size_t)>& write_item) {
  batched(count, write_item, op::SETITEM, op::SETITEMS);
}

std::string PickleWriter::finish() && {
  out_.push_back(op::STOP);
  return std::move(out_);
}

}  // namespace ckptfs::pickle
