// What this binary is: the project version (CMakeLists.txt's project(VERSION)) and the git revision it was
// built from (cmake/git_revision.cmake, at every build). `ckptfs --version`, ckptfs.json and the index
// cache's key carry them.
#pragma once

#include <string>
#include <string_view>

namespace ckptfs::version {

std::string_view project_version();  // "0.1.0"
// The commit's full hash, "-dirty" appended when tracked files differed from it; empty when the sources
// were not a git checkout (a tarball).
std::string_view git_revision();
// "ckptfs 0.1.0 (git <revision>)", or "ckptfs 0.1.0 (no git revision: not built from a git checkout)".
std::string version_line();

}  // namespace ckptfs::version
