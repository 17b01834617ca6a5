# Run at every build (cmake -P, from the ckptfs_git_revision target): writes OUTPUT, a C++ file that defines
# ckptfs::version::git_revision() as the git revision SOURCE_DIR is checked out at, with "-dirty" when
# tracked files differ from it. Outside a git checkout (a tarball, a Debian source package) it is empty,
# and `ckptfs --version` says so. OUTPUT is rewritten only when that changes, so an unchanged revision
# recompiles nothing.
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --verify -q HEAD
                OUTPUT_VARIABLE REVISION OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
# (a tarball unpacked inside another git checkout must not take that checkout's revision)
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --show-toplevel
                OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
get_filename_component(source_real "${SOURCE_DIR}" REALPATH)
get_filename_component(top_real "${top}" REALPATH)
if(failed OR NOT top OR NOT top_real STREQUAL source_real)
  set(REVISION "")
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes ERROR_QUIET)
  if(changes)
    string(APPEND REVISION "-dirty")
  endif()
endif()
set(text "// Written by cmake/git_revision.cmake at build time.\n#include \"ckptfs/version.hpp\"\n\n")
string(APPEND text "std::string_view ckptfs::version::git_revision() { return \"${REVISION}\"; }\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()
