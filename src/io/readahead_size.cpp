#include "io/readahead_size.hpp"

#include <fmt/format.h>
#include <sys/sysmacros.h>

#include <fstream>
#include <map>
#include <mutex>

namespace ckptfs::io {

uint64_t readahead_bytes(dev_t device) {
  constexpr uint64_t kDefault = 128 << 10;
  static std::mutex mutex;
  static std::map<dev_t, uint64_t> known;
  std::lock_guard lock(mutex);
  if (auto it = known.find(device); it != known.end()) return it->second;
  uint64_t kib = 0;
  std::ifstream in(fmt::format("/sys/class/bdi/{}:{}/read_ahead_kb", major(device), minor(device)));
  in >> kib;
  const uint64_t bytes = in && kib > 0 ? kib << 10 : kDefault;
  known.emplace(device, bytes);
  return bytes;
}

}  // namespace ckptfs::io
