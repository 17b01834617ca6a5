// libFuzzer target: the input as the one shard of a HuggingFaceStorageWriter dir (a safetensors header with
// DCP_SHARDING_INFO), opened, merged and its small tensors read.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "ckptfs/error.hpp"
#include "formats/dcp/hf_storage.hpp"
#include "io/fuzz_input.hpp"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path dir = [] {
    std::string pattern = (fs::temp_directory_path() / "ckptfs-hf-fuzz-XXXXXX").string();
    return fs::path(::mkdtemp(pattern.data()));
  }();
  const ckptfs::io::FuzzInput input(data, size);
  const fs::path shard = dir / "shard-00001-model-00001-of-00001.safetensors";
  std::error_code ec;
  fs::remove(shard, ec);
  fs::create_symlink(input.path(), shard, ec);
  try {
    const auto cp = ckptfs::dcp::open_hf_storage(dir, {});
    for (const auto& t : cp.tags.at(0).catalog(ViewRole::model)->tensors) {
      if (t.nbytes() > (1 << 16)) continue;
      std::vector<std::byte> out(t.nbytes());
      ckptfs::catalog::read_tensor(t, 0, out);
    }
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
