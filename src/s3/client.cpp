// Requests to the store: signing, retries, and the mapping of failures to errors that name the object.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "s3/handle_pool.hpp"
#include "s3/request_url.hpp"
#include "s3/xml.hpp"

namespace ckptfs::s3 {
namespace {

// Error and listing bodies are small; anything larger is not an answer we can use.
constexpr std::size_t kMaxTextBody = 16u << 20;
constexpr long kReceiveBufferBytes = 512L << 10;  // CURL_MAX_READ_SIZE of libcurl before 7.88

// One request's state, filled by libcurl's callbacks.
struct Exchange {
  CURL* curl = nullptr;
  std::byte* out = nullptr;  // the range's destination (ranged GET), else the body goes to `text`
  std::uint64_t capacity = 0;
  std::uint64_t written = 0;
  std::string aborted;  // why a callback stopped the transfer: the answer was not one we can use
  std::string text;
  std::string etag, last_modified;
  std::optional<std::uint64_t> content_length;
  curl_slist* headers = nullptr;
  char curl_error[CURL_ERROR_SIZE] = {};

  ~Exchange() { curl_slist_free_all(headers); }
  void add_header(const std::string& h) { headers = curl_slist_append(headers, h.c_str()); }
  long answered =
      0;  // the HTTP status of the last attempt, once it is over (the handle goes back to the pool)

  long live_status() const {  // inside callbacks, while the handle is ours
    long s = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &s);
    return s;
  }
};

bool success(long status) {
  return status == 200 || status == 206;
}

std::size_t on_body(char* data, std::size_t, std::size_t n, void* user) {
  auto& ex = *static_cast<Exchange*>(user);
  if (ex.out && success(ex.live_status())) {
    if (n > ex.capacity - ex.written) {
      ex.aborted = "the store answered more bytes than the range asked for";
      return 0;  // aborts the transfer
    }
    std::memcpy(ex.out + ex.written, data, n);
    ex.written += n;
    return n;
  }
  if (ex.text.size() + n > kMaxTextBody) {
    ex.aborted = fmt::format("the store's answer is larger than {} MiB", kMaxTextBody >> 20);
    return 0;
  }
  ex.text.append(data, n);
  return n;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  return s;
}

bool header_is(std::string_view line, std::string_view name) {
  return line.size() > name.size() && line[name.size()] == ':' &&
         std::equal(name.begin(), name.end(), line.begin(), [](char a, char b) {
           return std::tolower((unsigned char)a) == std::tolower((unsigned char)b);
         });
}

std::size_t on_header(char* data, std::size_t, std::size_t n, void* user) {
  auto& ex = *static_cast<Exchange*>(user);
  std::string_view line(data, n);
  auto value = [&](std::string_view name) { return trimmed(line.substr(name.size() + 1)); };
  if (line.starts_with(
          "HTTP/")) {  // a new response (after a 100 Continue): forget the previous one's headers
    ex.etag.clear();
    ex.last_modified.clear();
    ex.content_length.reset();
  } else if (header_is(line, "etag")) {
    ex.etag = value("etag");
  } else if (header_is(line, "last-modified")) {
    ex.last_modified = value("last-modified");
  } else if (header_is(line, "content-length")) {
    std::string_view v = value("content-length");
    std::uint64_t len = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), len);
    if (ec == std::errc{} && end == v.data() + v.size()) ex.content_length = len;
  }
  return n;
}

bool retryable(CURLcode rc, long status) {
  if (rc == CURLE_OK) return status >= 500 || status == 429;
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
      return true;
    default:
      return false;
  }
}

void sleep_before_retry(int retry) {
  thread_local std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<long> jitter(0, backoff_ceiling_ms(retry));
  std::this_thread::sleep_for(std::chrono::milliseconds(jitter(random)));
}

// HEAD answers have no body: name the status the way the AWS SDKs do.
std::string code_of(const Exchange& ex, long status) {
  if (std::string code = parse_error_code(ex.text); !code.empty()) return code;
  if (status == 404) return "NotFound";
  if (status == 403) return "Forbidden";
  if (status == 412) return "PreconditionFailed";
  return "";
}

}  // namespace

long backoff_ceiling_ms(int retry) {
  long ms = kFirstBackoffMs;
  for (int i = 1; i < retry && ms < kMaxBackoffMs; ++i) ms *= 2;
  return std::min(ms, kMaxBackoffMs);
}

struct Client::Impl {
  Config config;
  HandlePool pool;
  std::atomic<std::uint64_t> requests{0}, retries{0};

  // Sends the request built by `setup` (after the common options) until it succeeds, fails for good, or
  // runs out of attempts; throws Error naming `what` (the s3:// address) on failure.
  template <class Setup>
  void perform(const std::string& what, const std::string& url, Exchange& ex, Setup setup) {
    auto lease = pool.take();
    ex.curl = lease.get();
    struct Release {  // the handle is the pool's again once we return
      Exchange& ex;
      ~Release() { ex.curl = nullptr; }
    } release{ex};
    for (int attempt = 1;; ++attempt) {
      reset(ex);
      common_options(ex, url);
      setup(ex);
      curl_easy_setopt(ex.curl, CURLOPT_HTTPHEADER, ex.headers);
      ++requests;
      CURLcode rc = curl_easy_perform(ex.curl);
      long status = ex.answered = rc == CURLE_OK ? ex.live_status() : 0;
      if (rc == CURLE_OK && success(status)) return;
      if (attempt == kMaxAttempts || !ex.aborted.empty() || !retryable(rc, status))
        fail(what, ex, rc, status, attempt);
      ++retries;
      sleep_before_retry(attempt);
    }
  }

  static void reset(Exchange& ex) {
    curl_easy_reset(ex.curl);
    curl_slist_free_all(ex.headers);
    ex.headers = nullptr;
    ex.written = 0;
    ex.aborted.clear();
    ex.text.clear();
    ex.curl_error[0] = '\0';
  }

  void common_options(Exchange& ex, const std::string& url) const {
    CURL* c = ex.curl;
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM: safe in threads
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, kConnectTimeoutMs);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, kStallTimeoutS);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    // A receive buffer of kReceiveBufferBytes, not libcurl's 16 KiB: a GET of a few MiB in a few dozen
    // reads of the socket and calls of on_body, not hundreds.
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, kReceiveBufferBytes);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "ckptfs");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ex.curl_error);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &ex);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &ex);
    if (config.no_sign) return;
    std::string sigv4 = fmt::format("aws:amz:{}:s3", config.region);
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());  // libcurl copies string options
    curl_easy_setopt(c, CURLOPT_USERNAME, config.credentials.access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, config.credentials.secret_access_key.c_str());
    // libcurl 7.88 does not send the payload hash that S3 (and RGW) require with SigV4: the body is not
    // hashed (we send none), which this value declares.
    ex.add_header("x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!config.credentials.session_token.empty())
      ex.add_header("x-amz-security-token: " + config.credentials.session_token);
  }

  [[noreturn]] void fail(const std::string& what, const Exchange& ex, CURLcode rc, long status,
                         int attempts) const {
    std::string where = fmt::format("{} (endpoint {})", what, config.endpoint);
    if (!ex.aborted.empty()) throw Error(fmt::format("{}: {}", where, ex.aborted), ex.live_status(), "");
    if (rc != CURLE_OK)
      throw Error(fmt::format("{}: cannot reach the store: {} (after {} attempt{})", where,
                              ex.curl_error[0] ? ex.curl_error : curl_easy_strerror(rc), attempts,
                              attempts == 1 ? "" : "s"),
                  0, "");
    std::string code = code_of(ex, status);
    std::string detail = xml_text_or_empty(ex.text, "Message");
    std::string answer = fmt::format("HTTP {}{}{}{}", status, code.empty() ? "" : " ", code,
                                     detail.empty() ? "" : ": " + detail);
    if (attempts > 1) answer += fmt::format(" (after {} attempts)", attempts);
    if (status == 412)
      throw ObjectChangedError(
          fmt::format("{}: the object changed since it was opened ({} to If-Match)", where, answer), status,
          code);
    throw Error(fmt::format("{}: {}", where, answer), status, code);
  }

  static std::string xml_text_or_empty(std::string_view xml, std::string_view tag) {
    try {
      return xml.find("<Error>") == xml.npos ? "" : xml_text(xml, tag).value_or("");
    } catch (const XmlError&) {
      return "";
    }
  }
};

Client::Client(Config config) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
}
Client::~Client() = default;

std::uint64_t Client::requests() const {
  return impl_->requests;
}
std::uint64_t Client::retries() const {
  return impl_->retries;
}

ObjectInfo Client::head(const std::string& bucket, const std::string& key) {
  Exchange ex;
  std::string what = Url{bucket, key}.str();
  impl_->perform(what, request_url(impl_->config, bucket, key), ex,
                 [](Exchange& e) { curl_easy_setopt(e.curl, CURLOPT_NOBODY, 1L); });
  if (!ex.content_length)
    throw Error(fmt::format("{}: the store's HEAD answer has no Content-Length", what), 200, "");
  return {key, *ex.content_length, ex.etag, ex.last_modified};
}

void Client::get_range(const std::string& bucket, const std::string& key, std::uint64_t offset,
                       std::uint64_t length, const std::string& etag, std::byte* out) {
  if (length == 0) return;
  Exchange ex;
  ex.out = out;
  ex.capacity = length;
  std::string what = Url{bucket, key}.str();
  impl_->perform(what, request_url(impl_->config, bucket, key), ex, [&](Exchange& e) {
    e.add_header(fmt::format("Range: bytes={}-{}", offset, offset + length - 1));
    if (!etag.empty()) e.add_header("If-Match: " + etag);
  });
  // A 200 is the whole object: right only when the range was all of it (the byte count checks that).
  if (ex.written != length || (ex.answered == 200 && offset != 0))
    throw Error(fmt::format("{}: asked for bytes {}-{}, the store answered {} bytes (HTTP {})", what, offset,
                            offset + length - 1, ex.written, ex.answered),
                ex.answered, "");
}

ListPage Client::list_page(const std::string& bucket, const std::string& prefix,
                           const std::string& continuation_token, int max_keys) {
  QueryParams query{{"list-type", "2"}, {"prefix", prefix}};
  if (!continuation_token.empty()) query.emplace_back("continuation-token", continuation_token);
  if (max_keys > 0) query.emplace_back("max-keys", std::to_string(max_keys));
  Exchange ex;
  std::string what = Url{bucket, prefix}.str();
  impl_->perform(what, request_url(impl_->config, bucket, "", std::move(query)), ex, [](Exchange&) {});
  try {
    return parse_list_page(ex.text);
  } catch (const XmlError& e) {
    throw Error(fmt::format("{}: malformed ListObjectsV2 answer: {}", what, e.what()), ex.answered, "");
  }
}

std::vector<ObjectInfo> Client::list(const std::string& bucket, const std::string& prefix, int max_keys) {
  std::vector<ObjectInfo> all;
  std::string token;
  do {
    ListPage page = list_page(bucket, prefix, token, max_keys);
    std::move(page.objects.begin(), page.objects.end(), std::back_inserter(all));
    if (page.truncated && page.next_continuation_token == token)
      throw Error(fmt::format("{}: the listing repeats its continuation token", Url{bucket, prefix}.str()),
                  200, "");
    token = page.truncated ? page.next_continuation_token : "";
  } while (!token.empty());
  return all;
}

}  // namespace ckptfs::s3
