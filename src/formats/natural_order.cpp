#include "formats/natural_order.hpp"

#include <algorithm>
#include <cctype>

namespace ckptfs {

namespace {

bool is_digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && is_digit(a[ie])) ++ie;
      while (je < b.size() && is_digit(b[je])) ++je;
      // Compare digit runs by value: strip leading zeros, then length, then digits.
      std::string_view da = a.substr(i, ie - i), db = b.substr(j, je - j);
      da.remove_prefix(std::min(da.find_first_not_of('0'), da.size()));
      db.remove_prefix(std::min(db.find_first_not_of('0'), db.size()));
      if (da.size() != db.size()) return da.size() < db.size();
      if (da != db) return da < db;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

bool same_series(std::string_view a, std::string_view b) {
  const auto skip_digits = [](std::string_view s, size_t i) {
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i;
  };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool digit_a = a[i] >= '0' && a[i] <= '9', digit_b = b[j] >= '0' && b[j] <= '9';
    if (digit_a != digit_b) return false;
    if (digit_a) {
      i = skip_digits(a, i);
      j = skip_digits(b, j);
    } else if (a[i++] != b[j++]) {
      return false;
    }
  }
  return i == a.size() && j == b.size();
}

bool tracker_reached(std::string_view tracked, std::string_view name) {
  return !same_series(tracked, name) || !natural_less(tracked, name);
}

}  // namespace ckptfs
