#include "ckptfs/version.hpp"

namespace ckptfs::version {

std::string_view project_version() {
  return CKPTFS_VERSION;
}

std::string version_line() {
  const std::string_view revision = git_revision();
  return "ckptfs " + std::string(project_version()) +
         (revision.empty() ? " (no git revision: not built from a git checkout)"
                           : " (git " + std::string(revision) + ")");
}

}  // namespace ckptfs::version
