#include "cli/source_argument.hpp"

#include <memory>

namespace ckptfs::cli {

io::SourcePtr open_source(const std::string& text, const s3::Options& options, io::Runtime& runtime) {
  if (!s3::is_s3_url(text)) return runtime.open_local(std::filesystem::absolute(text).lexically_normal());
  const s3::Url url = s3::parse_url(text);
  return runtime.open_remote(url, std::make_shared<s3::Client>(s3::resolve_config(options)));
}

}  // namespace ckptfs::cli
