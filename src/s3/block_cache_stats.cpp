#include <nlohmann/json.hpp>

#include "ckptfs/s3_cache.hpp"

namespace ckptfs::s3 {

void to_json(nlohmann::json& out, const BlockCacheStats& stats) {
  out = {{"bytes_fetched", stats.bytes_fetched},
         {"requests", stats.requests},
         {"retries", stats.retries},
         {"hits", stats.hits},
         {"misses", stats.misses},
         {"disk_hits", stats.disk_hits},
         {"memory_bytes", stats.memory_bytes},
         {"disk_bytes", stats.disk_bytes}};
}

void to_json(nlohmann::json& out, const ObjectFetchStats& stats) {
  out = {{"key", stats.key},
         {"etag", stats.etag},
         {"bytes_fetched", stats.bytes_fetched},
         {"requests", stats.requests}};
}

}  // namespace ckptfs::s3
