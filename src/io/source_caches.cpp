#include "io/source_caches.hpp"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace ckptfs::io {

namespace {

struct Registered {
  std::filesystem::path root;
  std::weak_ptr<SourceCaches> caches;
};

// The sources of the Runtimes alive in this process (the one lookup left process-wide: a path names its
// source the same way in every thread).
struct Registry {
  std::mutex mutex;
  std::vector<Registered> sources;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: Files may outlive static destruction
  return *instance;
}

// `path` without a trailing separator ("ckpt/" names the same source as "ckpt").
std::filesystem::path trimmed(const std::filesystem::path& path) {
  return path.has_filename() || !path.has_parent_path() ? path : path.parent_path();
}

// The number of `root`'s components when `path` is it or lies below it, else 0.
size_t depth_below(const std::filesystem::path& path, const std::filesystem::path& root) {
  const auto [r, p] = std::mismatch(root.begin(), root.end(), path.begin(), path.end());
  return r == root.end() ? static_cast<size_t>(std::distance(root.begin(), root.end())) : 0;
}

}  // namespace

void register_source(const std::filesystem::path& root, const std::shared_ptr<SourceCaches>& caches) {
  std::lock_guard lock(registry().mutex);
  std::erase_if(registry().sources, [](const Registered& r) { return r.caches.expired(); });
  registry().sources.push_back({trimmed(root), caches});
}

std::shared_ptr<SourceCaches> caches_for(const std::filesystem::path& path) {
  {
    std::lock_guard lock(registry().mutex);
    std::shared_ptr<SourceCaches> best;
    size_t best_depth = 0;
    for (const auto& r : registry().sources)
      if (const size_t depth = depth_below(path, r.root); depth > best_depth)
        if (auto caches = r.caches.lock()) {
          best = std::move(caches);
          best_depth = depth;
        }
    if (best) return best;
  }
  return std::make_shared<SourceCaches>(1, true, kDefaultDecodedCacheBytes);
}

}  // namespace ckptfs::io
