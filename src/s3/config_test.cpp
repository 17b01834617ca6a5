#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "ckptfs/s3.hpp"
#include "s3/request_url.hpp"

namespace ckptfs::s3 {
namespace {

Environment env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

TEST(S3Url, BucketAndPrefix) {
  Url u = parse_url("s3://my-bucket/ckpt/global_step10");
  EXPECT_EQ(u.bucket, "my-bucket");
  EXPECT_EQ(u.prefix, "ckpt/global_step10");
  EXPECT_EQ(u.key("latest"), "ckpt/global_step10/latest");
  EXPECT_EQ(u.str(), "s3://my-bucket/ckpt/global_step10");
  EXPECT_EQ(parse_url("s3://my-bucket/ckpt/").key("latest"), "ckpt/latest");
}

TEST(S3Url, WholeBucket) {
  Url u = parse_url("s3://bucket1");
  EXPECT_EQ(u.prefix, "");
  EXPECT_EQ(u.key("a/b"), "a/b");
  EXPECT_EQ(parse_url("s3://bucket1/").prefix, "");
}

TEST(S3Url, RejectsWhatIsNotOne) {
  EXPECT_TRUE(is_s3_url("s3://b"));
  EXPECT_FALSE(is_s3_url("/data/s3://b"));
  for (const char* bad : {"/local/dir", "s3://", "s3:///prefix", "s3://ab/x", "s3://Upper/x", "s3://-bad/x",
                          "s3://bad-/x", "s3://a b c/x"}) {
    EXPECT_THROW(parse_url(bad), SourceError) << bad;
  }
  try {
    parse_url("s3://Bad_Bucket/x");
    FAIL();
  } catch (const SourceError& e) {
    EXPECT_NE(std::string(e.what()).find("s3://Bad_Bucket/x"), std::string::npos) << e.what();
  }
}

TEST(S3Config, OptionsWinOverEnvironment) {
  auto env = env_of({{"AWS_ENDPOINT_URL", "http://env:1/"},
                     {"AWS_REGION", "eu-west-1"},
                     {"AWS_ACCESS_KEY_ID", "AK"},
                     {"AWS_SECRET_ACCESS_KEY", "SK"}});
  Options o;
  o.endpoint = "http://127.0.0.1:9125/";
  o.region = "ap-south-1";
  Config c = resolve_config(o, env);
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:9125");
  EXPECT_EQ(c.region, "ap-south-1");
  EXPECT_TRUE(c.path_style);
  Config from_env = resolve_config({}, env);
  EXPECT_EQ(from_env.endpoint, "http://env:1");
  EXPECT_EQ(from_env.region, "eu-west-1");
  EXPECT_EQ(from_env.credentials.access_key_id, "AK");
  EXPECT_EQ(from_env.credentials.secret_access_key, "SK");
  EXPECT_EQ(from_env.credentials.session_token, "");
}

TEST(S3Config, AwsDefaults) {
  auto env = env_of({{"AWS_DEFAULT_REGION", "us-west-2"},
                     {"AWS_ACCESS_KEY_ID", "AK"},
                     {"AWS_SECRET_ACCESS_KEY", "SK"},
                     {"AWS_SESSION_TOKEN", "TOK"}});
  Config c = resolve_config({}, env);
  EXPECT_EQ(c.region, "us-west-2");
  EXPECT_EQ(c.endpoint, "https://s3.us-west-2.amazonaws.com");
  EXPECT_FALSE(c.path_style);
  EXPECT_EQ(c.credentials.session_token, "TOK");
  EXPECT_EQ(resolve_config({}, env_of({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"}})).region,
            "us-east-1");
  Options path_style;
  path_style.path_style = true;
  EXPECT_TRUE(resolve_config(path_style, env).path_style);
}

TEST(S3Config, BadEndpointAndNoCredentials) {
  Options no_scheme;
  no_scheme.endpoint = "127.0.0.1:9125";
  EXPECT_THROW(resolve_config(no_scheme, env_of({})), SourceError);
  EXPECT_THROW(resolve_config({}, env_of({{"HOME", "/nonexistent"}})), SourceError);
  Options no_sign;
  no_sign.no_sign = true;
  Config anonymous = resolve_config(no_sign, env_of({}));
  EXPECT_TRUE(anonymous.no_sign);
  EXPECT_EQ(anonymous.credentials.access_key_id, "");
}

constexpr const char* kCredentialsFile = R"(# comment
[default]
aws_access_key_id = DEFAULTKEY
aws_secret_access_key=DEFAULTSECRET

[ training ]
; another comment
aws_access_key_id   =   TRAINKEY
aws_secret_access_key = TRAIN/SECRET+x=
aws_session_token = TOKEN
[incomplete]
aws_access_key_id = ONLYKEY
)";

TEST(S3Config, CredentialsFileProfiles) {
  auto d = parse_credentials_file(kCredentialsFile, "default");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->access_key_id, "DEFAULTKEY");
  EXPECT_EQ(d->secret_access_key, "DEFAULTSECRET");
  auto t = parse_credentials_file(kCredentialsFile, "training");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->access_key_id, "TRAINKEY");
  EXPECT_EQ(t->secret_access_key, "TRAIN/SECRET+x=");
  EXPECT_EQ(t->session_token, "TOKEN");
  EXPECT_FALSE(parse_credentials_file(kCredentialsFile, "incomplete"));
  EXPECT_FALSE(parse_credentials_file(kCredentialsFile, "absent"));
  EXPECT_FALSE(parse_credentials_file("[default\naws_access_key_id=A\naws_secret_access_key=B\n", "default"));
}

TEST(S3Config, CredentialsFileFromProfileVariable) {
  auto path = std::filesystem::temp_directory_path() / ("ckptfs-s3-credentials-" + std::to_string(getpid()));
  std::ofstream(path) << kCredentialsFile;
  auto env = env_of({{"AWS_SHARED_CREDENTIALS_FILE", path.string()}, {"AWS_PROFILE", "training"}});
  Config c = resolve_config({}, env);
  std::filesystem::remove(path);
  EXPECT_EQ(c.credentials.access_key_id, "TRAINKEY");
  EXPECT_EQ(c.credentials.session_token, "TOKEN");
}

TEST(S3RequestUrl, CanonicalPathAndSortedQuery) {
  Config path_style;
  path_style.endpoint = "http://127.0.0.1:9125";
  path_style.path_style = true;
  EXPECT_EQ(request_url(path_style, "b1", "ckpt/a b+c=d~_.-/x"),
            "http://127.0.0.1:9125/b1/ckpt/a%20b%2Bc%3Dd~_.-/x");
  EXPECT_EQ(request_url(path_style, "b1", "", {{"prefix", "ckpt/"}, {"max-keys", "2"}, {"list-type", "2"}}),
            "http://127.0.0.1:9125/b1?list-type=2&max-keys=2&prefix=ckpt%2F");
  Config virtual_hosted;
  virtual_hosted.endpoint = "https://s3.us-west-2.amazonaws.com";
  EXPECT_EQ(request_url(virtual_hosted, "b1", "k/\xc3\xa9"),
            "https://b1.s3.us-west-2.amazonaws.com/k/%C3%A9");
}

TEST(S3Retry, BackoffDoublesUpToItsCap) {
  EXPECT_EQ(backoff_ceiling_ms(1), kFirstBackoffMs);
  EXPECT_EQ(backoff_ceiling_ms(2), 2 * kFirstBackoffMs);
  EXPECT_EQ(backoff_ceiling_ms(3), 4 * kFirstBackoffMs);
  EXPECT_EQ(backoff_ceiling_ms(30), kMaxBackoffMs);
}

}  // namespace
}  // namespace ckptfs::s3
