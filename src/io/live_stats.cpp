#include "ckptfs/live_stats.hpp"

namespace ckptfs::io {

void LiveStats::add_section(const std::string& name, std::function<nlohmann::json()> figures) {
  std::lock_guard lock(mutex_);
  sections_[name] = std::move(figures);
}

void LiveStats::remove_section(const std::string& name) {
  std::lock_guard lock(mutex_);
  sections_.erase(name);
}

nlohmann::json LiveStats::snapshot() const {
  std::lock_guard lock(mutex_);  // figures() must not register a section
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, figures] : sections_) out[name] = figures();
  return out;
}

}  // namespace ckptfs::io
