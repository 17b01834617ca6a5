#include "cli/source_argument.hpp"

#include <memory>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::cli {

std::filesystem::path open_source(const std::string& text, const s3::Options& options, io::Runtime& runtime) {
  if (!s3::is_s3_url(text)) {
    auto path = std::filesystem::absolute(text).lexically_normal();
    runtime.add_source(path);
    return path;
  }
  const s3::Url url = s3::parse_url(text);
  return io::open_remote_source(url, std::make_shared<s3::Client>(s3::resolve_config(options)), runtime);
}

}  // namespace ckptfs::cli
