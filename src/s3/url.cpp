// s3://BUCKET/PREFIX addresses.
#include <fmt/format.h>

#include "ckptfs/s3.hpp"

namespace ckptfs::s3 {
namespace {

constexpr std::string_view kScheme = "s3://";

// S3's bucket naming rules (3-63 characters, lower-case letters, digits, '.', '-', starting and ending with
// a letter or digit), plus '_' that older buckets and some compatible stores accept.
bool valid_bucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  for (char c : b)
    if (!alnum(c) && c != '.' && c != '-' && c != '_') return false;
  return alnum(b.front()) && alnum(b.back());
}

}  // namespace

std::string Url::key(std::string_view name) const {
  if (prefix.empty()) return std::string(name);
  if (prefix.back() == '/') return fmt::format("{}{}", prefix, name);
  return fmt::format("{}/{}", prefix, name);
}

std::string Url::str() const {
  return fmt::format("{}{}/{}", kScheme, bucket, prefix);
}

bool is_s3_url(std::string_view text) {
  return text.starts_with(kScheme);
}

Url parse_url(std::string_view text) {
  if (!is_s3_url(text)) throw SourceError(fmt::format("{}: not an s3://BUCKET/PREFIX address", text));
  std::string_view rest = text.substr(kScheme.size());
  std::size_t slash = rest.find('/');
  Url url{std::string(rest.substr(0, slash)), slash == rest.npos ? "" : std::string(rest.substr(slash + 1))};
  if (!valid_bucket(url.bucket))
    throw SourceError(fmt::format("{}: '{}' is not a valid bucket name (3-63 characters: a-z, 0-9, '.', '-')",
                                  text, url.bucket));
  return url;
}

}  // namespace ckptfs::s3
