// Where the store is and who we are to it: options, then the AWS environment variables and shared
// credentials file that the AWS CLI and SDKs read.
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "ckptfs/s3.hpp"

namespace ckptfs::s3 {
namespace {

constexpr std::string_view kDefaultRegion = "us-east-1";

std::string_view trim(std::string_view s) {
  std::size_t b = s.find_first_not_of(" \t\r");
  if (b == s.npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::optional<std::string> first_set(const Environment& env, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (auto v = env(n); v && !v->empty()) return v;
  return std::nullopt;
}

std::string normalized_endpoint(std::string endpoint) {
  if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://"))
    throw SourceError(
        fmt::format("endpoint {}: expected http://HOST[:PORT] or https://HOST[:PORT]", endpoint));
  while (endpoint.ends_with('/')) endpoint.pop_back();
  return endpoint;
}

std::optional<Credentials> credentials_from_file(const Environment& env) {
  std::string path;
  if (auto f = first_set(env, {"AWS_SHARED_CREDENTIALS_FILE"}))
    path = *f;
  else if (auto home = first_set(env, {"HOME"}))
    path = *home + "/.aws/credentials";
  else
    return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_credentials_file(text.str(), first_set(env, {"AWS_PROFILE"}).value_or("default"));
}

}  // namespace

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

std::optional<Credentials> parse_credentials_file(std::string_view text, std::string_view profile) {
  Credentials found;
  bool in_profile = false;
  while (!text.empty()) {
    std::size_t eol = text.find('\n');
    std::string_view line = trim(text.substr(0, eol));
    text = eol == text.npos ? std::string_view{} : text.substr(eol + 1);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      in_profile = line.back() == ']' && trim(line.substr(1, line.size() - 2)) == profile;
      continue;
    }
    std::size_t eq = line.find('=');
    if (!in_profile || eq == line.npos) continue;
    std::string_view key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    if (key == "aws_access_key_id")
      found.access_key_id = value;
    else if (key == "aws_secret_access_key")
      found.secret_access_key = value;
    else if (key == "aws_session_token")
      found.session_token = value;
  }
  if (found.access_key_id.empty() || found.secret_access_key.empty()) return std::nullopt;
  return found;
}

Config resolve_config(const Options& options, const Environment& env) {
  Config c;
  c.region = options.region.value_or(
      first_set(env, {"AWS_REGION", "AWS_DEFAULT_REGION"}).value_or(std::string(kDefaultRegion)));
  std::optional<std::string> endpoint =
      options.endpoint ? options.endpoint : first_set(env, {"AWS_ENDPOINT_URL"});
  c.endpoint =
      endpoint ? normalized_endpoint(*endpoint) : fmt::format("https://s3.{}.amazonaws.com", c.region);
  // Compatible stores (RGW, MinIO) seldom have wildcard DNS for virtual-hosted buckets.
  c.path_style = options.path_style || endpoint.has_value();
  c.no_sign = options.no_sign;
  if (c.no_sign) return c;
  auto id = first_set(env, {"AWS_ACCESS_KEY_ID"}), secret = first_set(env, {"AWS_SECRET_ACCESS_KEY"});
  if (id && secret) {
    c.credentials = {*id, *secret, first_set(env, {"AWS_SESSION_TOKEN"}).value_or("")};
  } else if (auto from_file = credentials_from_file(env)) {
    c.credentials = *from_file;
  } else {
    throw SourceError(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in "
        "~/.aws/credentials "
        "(AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE), or -o s3_no_sign for a public bucket");
  }
  return c;
}

}  // namespace ckptfs::s3
