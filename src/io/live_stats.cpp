#include "ckptfs/live_stats.hpp"

#include <map>
#include <mutex>

namespace ckptfs::live_stats {

namespace {

struct Sections {
  std::mutex mutex;
  std::map<std::string, std::function<nlohmann::json()>> figures;
};

Sections& sections() {
  static Sections s;
  return s;
}

}  // namespace

void add_section(const std::string& name, std::function<nlohmann::json()> figures) {
  Sections& s = sections();
  std::lock_guard lock(s.mutex);
  s.figures[name] = std::move(figures);
}

void remove_section(const std::string& name) {
  Sections& s = sections();
  std::lock_guard lock(s.mutex);
  s.figures.erase(name);
}

nlohmann::json snapshot() {
  Sections& s = sections();
  std::lock_guard lock(s.mutex);  // figures() must not register a section
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, figures] : s.figures) out[name] = figures();
  return out;
}

}  // namespace ckptfs::live_stats
