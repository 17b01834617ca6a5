#include "index/build_id.hpp"

#include <elf.h>
#include <fmt/format.h>
#include <link.h>

#include <cstring>

namespace ckptfs::index {

namespace {

constexpr size_t align4(size_t n) {
  return (n + 3) & ~size_t{3};
}

// The NT_GNU_BUILD_ID note in the PT_NOTE segments of the main program (dl_iterate_phdr lists it first).
int find_build_id(dl_phdr_info* info, size_t /*size*/, void* out) {
  auto& id = *static_cast<std::string*>(out);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* at = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
    const auto* end = at + ph.p_memsz;
    while (end - at >= static_cast<ptrdiff_t>(sizeof(ElfW(Nhdr)))) {
      ElfW(Nhdr) note;
      std::memcpy(&note, at, sizeof note);
      const unsigned char* name = at + sizeof note;
      const unsigned char* desc = name + align4(note.n_namesz);
      if (desc + align4(note.n_descsz) > end) break;
      if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        for (size_t k = 0; k < note.n_descsz; ++k) id += fmt::format("{:02x}", desc[k]);
        return 1;
      }
      at = desc + align4(note.n_descsz);
    }
  }
  return 1;  // only the main program
}

}  // namespace

const std::string& build_id() {
  static const std::string id = [] {
    std::string out;
    dl_iterate_phdr(find_build_id, &out);
    return out;
  }();
  return id;
}

}  // namespace ckptfs::index
