// The GNU build id of the running ckptfs (the linker's hash of the linked binary, an ELF note: CMake links
// with -Wl,--build-id=sha1). The index cache keys every index with it, so that a rebuilt ckptfs, whose
// merge rules may differ without a format change, never trusts an index an older build wrote. A note,
// rather than a hash of /proc/self/exe: it costs no read of the binary and is there even when the file
// was replaced under a running daemon.
#pragma once

#include <string>

namespace ckptfs::index {

// The id in lowercase hex (as `readelf -n` and `file` print it); empty when the binary has none.
const std::string& build_id();

}  // namespace ckptfs::index
