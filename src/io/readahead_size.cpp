#include "io/readahead_size.hpp"

#include <fmt/format.h>
#include <sys/sysmacros.h>

#include <fstream>

namespace ckptfs::io {

uint64_t DeviceReadahead::bytes(dev_t device) {
  constexpr uint64_t kDefault = 128 << 10;
  std::lock_guard lock(mutex_);
  if (auto it = known_.find(device); it != known_.end()) return it->second;
  uint64_t kib = 0;
  std::ifstream in(fmt::format("/sys/class/bdi/{}:{}/read_ahead_kb", major(device), minor(device)));
  in >> kib;
  const uint64_t bytes = in && kib > 0 ? kib << 10 : kDefault;
  known_.emplace(device, bytes);
  return bytes;
}

}  // namespace ckptfs::io
