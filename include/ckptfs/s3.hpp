// The S3 client (issue 19): addresses, configuration and the requests ckptfs needs from an object store
// (HEAD, ranged GET pinned to an ETag, ListObjectsV2), over libcurl with its own SigV4 signing. It knows
// nothing of checkpoints or of io/: the remote source kind of io/ is built on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.hpp"

namespace ckptfs::s3 {

// s3://BUCKET/PREFIX. The prefix keeps what follows the bucket verbatim (no leading '/'; "" for the whole
// bucket); `key(name)` joins it with a name below it.
struct Url {
  std::string bucket;
  std::string prefix;

  std::string key(std::string_view name) const;
  std::string str() const;  // "s3://bucket/prefix"
};

bool is_s3_url(std::string_view text);
// Throws SourceError naming `text` when it is not s3://BUCKET[/PREFIX] with a valid bucket name.
Url parse_url(std::string_view text);

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
};

// What the command line says (-o endpoint=, -o region=, -o s3_path_style, -o s3_no_sign).
struct Options {
  std::optional<std::string> endpoint;
  std::optional<std::string> region;
  bool path_style = false;
  bool no_sign = false;
};

struct Config {
  std::string endpoint;  // scheme://host[:port], no trailing '/' (AWS's: https://s3.REGION.amazonaws.com)
  std::string region;
  bool path_style = false;  // http://host/bucket/key instead of http://bucket.host/key
  bool no_sign = false;     // anonymous requests (public buckets): no credentials needed
  Credentials credentials;
};

// Looks a variable up; tests pass their own instead of the process environment.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment process_environment();

// Options first, then AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION (default us-east-1), credentials from
// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else the profile AWS_PROFILE (default
// "default") of AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials). A custom endpoint implies
// path-style addressing. Throws SourceError when signing is on and no credentials are found.
Config resolve_config(const Options& options, const Environment& env = process_environment());

// The profile's keys in the text of an AWS shared credentials file (INI: [profile] then key = value lines,
// '#' or ';' comments); nullopt when the profile is absent or lacks a key id or secret.
std::optional<Credentials> parse_credentials_file(std::string_view text, std::string_view profile);

// An object's identity: a read pinned to it never returns bytes of another version.
struct ObjectInfo {
  std::string key;
  std::uint64_t size = 0;
  std::string etag;           // as the store sends it, quotes included
  std::string last_modified;  // as the store sends it (RFC 1123 in HEAD, ISO 8601 in listings)
};

struct ListPage {
  std::vector<ObjectInfo> objects;
  bool truncated = false;
  std::string next_continuation_token;
};

// A request failed. The message names the URL, the HTTP status and the S3 error code (`code()`, e.g.
// AccessDenied, NoSuchBucket, SignatureDoesNotMatch; "" when the store sent none or none was reached).
class Error : public SourceError {
 public:
  Error(const std::string& message, long http_status, std::string code)
      : SourceError(message), http_status_(http_status), code_(std::move(code)) {}
  long http_status() const { return http_status_; }  // 0: no HTTP answer (unreachable, timeout)
  const std::string& code() const { return code_; }

 private:
  long http_status_;
  std::string code_;
};

// The object no longer has the ETag a read was pinned to (412 to If-Match): it was replaced.
struct ObjectChangedError : Error {
  using Error::Error;
};

// Retries: a request failing with 5xx, 429, a refused or reset connection or a stall is sent again, up to
// kMaxAttempts times in all, after a backoff of kFirstBackoffMs doubled at each retry (capped at
// kMaxBackoffMs) with full jitter (a uniform delay in [0, backoff]). An attempt gives up when it cannot
// connect within kConnectTimeoutMs or receives nothing for kStallTimeoutS, so a request fails in bounded
// time: at most kMaxAttempts * kStallTimeoutS + the backoffs (4 * 15 s + 1.4 s), about 1.4 s when the store
// refuses connections.
inline constexpr int kMaxAttempts = 4;
inline constexpr long kFirstBackoffMs = 200;
inline constexpr long kMaxBackoffMs = 2000;
inline constexpr long kConnectTimeoutMs = 5000;
inline constexpr long kStallTimeoutS = 15;

// The backoff ceiling before retry `retry` (1-based): kFirstBackoffMs * 2^(retry-1), at most kMaxBackoffMs.
long backoff_ceiling_ms(int retry);

class Client {
 public:
  explicit Client(Config config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  ObjectInfo head(const std::string& bucket, const std::string& key);
  // Reads [offset, offset + length) of the object into `out` (exactly `length` bytes or an Error). With an
  // `etag`, the read carries If-Match: an object replaced since gives ObjectChangedError.
  void get_range(const std::string& bucket, const std::string& key, std::uint64_t offset,
                 std::uint64_t length, const std::string& etag, std::byte* out);
  // One ListObjectsV2 page of the keys under `prefix` (`max_keys` 0: the store's default, 1000 on S3).
  ListPage list_page(const std::string& bucket, const std::string& prefix,
                     const std::string& continuation_token, int max_keys = 0);
  // Every object under `prefix`, following continuation tokens.
  std::vector<ObjectInfo> list(const std::string& bucket, const std::string& prefix, int max_keys = 0);

  // Requests sent, including retries (for counters and tests).
  std::uint64_t requests() const;
  std::uint64_t retries() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptfs::s3
