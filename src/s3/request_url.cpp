#include "s3/request_url.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ckptfs::s3 {

std::string uri_encode(std::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved || (keep_slash && c == '/'))
      out += char(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::string request_url(const Config& config, std::string_view bucket, std::string_view key,
                        QueryParams query) {
  std::string url;
  if (config.path_style) {
    url = fmt::format("{}/{}", config.endpoint, bucket);
    if (!key.empty()) url += '/';
  } else {
    std::size_t host = config.endpoint.find("://") + 3;
    url = fmt::format("{}{}.{}/", config.endpoint.substr(0, host), bucket, config.endpoint.substr(host));
  }
  url += uri_encode(key, true);
  std::sort(query.begin(), query.end());
  char sep = '?';
  for (const auto& [name, value] : query) {
    url += fmt::format("{}{}={}", sep, uri_encode(name, false), uri_encode(value, false));
    sep = '&';
  }
  return url;
}

}  // namespace ckptfs::s3
