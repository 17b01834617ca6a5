// Figures a mount shows live in its ckptfs-stats.json: the parts of the daemon that count something (the
// FUSE server's bytes served per file, the object-store cache's fetches) each register a section once,
// and the file's bytes are every section's figures at the moment it is opened. One per io::Runtime.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace ckptfs::io {

class LiveStats {
 public:
  // Adds (or replaces) the section `name`: figures() is called at each snapshot, from any thread.
  void add_section(const std::string& name, std::function<nlohmann::json()> figures);

  // Drops the section `name` (its figures() may refer to what is going away).
  void remove_section(const std::string& name);

  // {name: figures(), ...} of every section, by name.
  nlohmann::json snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::function<nlohmann::json()>> sections_;
};

}  // namespace ckptfs::io
