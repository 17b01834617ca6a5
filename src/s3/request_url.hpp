// The URL of a request, written the way SigV4 signs it. libcurl signs the path and query exactly as given
// (Debian 12's 7.88 neither sorts the query nor re-encodes it), so they are built here in canonical form:
// every byte outside A-Z a-z 0-9 - . _ ~ percent-encoded ('/' kept in the path), parameters sorted by name.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckptfs/s3.hpp"

namespace ckptfs::s3 {

using QueryParams = std::vector<std::pair<std::string, std::string>>;

std::string uri_encode(std::string_view s, bool keep_slash);

// Path-style: ENDPOINT/BUCKET/KEY; virtual-hosted: SCHEME://BUCKET.HOST/KEY. `key` "" addresses the bucket.
std::string request_url(const Config& config, std::string_view bucket, std::string_view key,
                        QueryParams query = {});

}  // namespace ckptfs::s3
