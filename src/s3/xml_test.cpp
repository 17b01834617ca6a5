#include "s3/xml.hpp"

#include <gtest/gtest.h>

namespace ckptfs::s3 {
namespace {

// The shape of Ceph RGW's and AWS's ListObjectsV2 answers.
constexpr const char* kPage =
    R"(<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket1</Name><Prefix>ckpt/</Prefix><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated><Contents><Key>ckpt/a&amp;b &lt;1&gt;.pt</Key><LastModified>2026-12-01T13:20:09.000Z</LastModified><ETag>&quot;64855ac829e404eea8431ec6962a8816&quot;</ETag><Size>10000</Size><StorageClass>STANDARD</StorageClass><Owner><ID>tester</ID></Owner></Contents><Contents><Key>ckpt/caf&#xE9;&#233;</Key><LastModified>2026-12-01T13:20:10.000Z</LastModified><ETag>"abc-2"</ETag><Size>18446744073709551615</Size></Contents><KeyCount>2</KeyCount><NextContinuationToken>ckpt/caf&#xE9;</NextContinuationToken></ListBucketResult>)";

TEST(S3Xml, ListPage) {
  ListPage p = parse_list_page(kPage);
  ASSERT_EQ(p.objects.size(), 2u);
  EXPECT_EQ(p.objects[0].key, "ckpt/a&b <1>.pt");
  EXPECT_EQ(p.objects[0].size, 10000u);
  EXPECT_EQ(p.objects[0].etag, "\"64855ac829e404eea8431ec6962a8816\"");
  EXPECT_EQ(p.objects[0].last_modified, "2026-12-01T13:20:09.000Z");
  EXPECT_EQ(p.objects[1].key, "ckpt/caf\xc3\xa9\xc3\xa9");
  EXPECT_EQ(p.objects[1].size, 18446744073709551615u);
  EXPECT_EQ(p.objects[1].etag, "\"abc-2\"");
  EXPECT_TRUE(p.truncated);
  EXPECT_EQ(p.next_continuation_token, "ckpt/caf\xc3\xa9");
}

TEST(S3Xml, LastAndEmptyPages) {
  ListPage last = parse_list_page(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>0</Size></Contents>"
      "</ListBucketResult>");
  ASSERT_EQ(last.objects.size(), 1u);
  EXPECT_EQ(last.objects[0].size, 0u);
  EXPECT_FALSE(last.truncated);
  ListPage empty = parse_list_page(
      R"(<ListBucketResult xmlns="x"><Name>b</Name><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>)");
  EXPECT_TRUE(empty.objects.empty());
}

TEST(S3Xml, RejectsMalformedPages) {
  for (const char* bad : {
           "<Error><Code>NoSuchBucket</Code></Error>",
           "<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>",    // no size
           "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",  // no key
           "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>k</Key><Size>99999999999999999999</Size></Contents></"
           "ListBucketResult>",
           "<ListBucketResult><Contents><Key>k</Key><Size>1</Size></ListBucketResult>",  // unclosed
           "<ListBucketResult><Contents><Key>a&bogus;</Key><Size>1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>a&#0;</Key><Size>1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>a&#xD800;</Key><Size>1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>a&amp</Key><Size>1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",  // no token
           "<ListBucketResult><IsTruncated>yes</IsTruncated></ListBucketResult>",
       }) {
    EXPECT_THROW(parse_list_page(bad), XmlError) << bad;
  }
}

TEST(S3Xml, ErrorCode) {
  EXPECT_EQ(
      parse_error_code(
          R"(<?xml version="1.0" encoding="UTF-8"?><Error><Code>SignatureDoesNotMatch</Code><Message></Message><RequestId>tx0</RequestId></Error>)"),
      "SignatureDoesNotMatch");
  EXPECT_EQ(parse_error_code("<Error><Code>NoSuchBucket</Code><BucketName>b</BucketName></Error>"),
            "NoSuchBucket");
  EXPECT_EQ(parse_error_code(""), "");
  EXPECT_EQ(parse_error_code("<html>502 Bad Gateway</html>"), "");
  EXPECT_EQ(parse_error_code("<Error><Code>unclosed"), "");
}

}  // namespace
}  // namespace ckptfs::s3
