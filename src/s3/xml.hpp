// The little XML that S3 answers need: ListObjectsV2 pages and <Error><Code>. Not a general parser: it finds
// elements by exact tag name (S3 answers are flat, one namespace, no attributes on the elements we read),
// decodes the five predefined entities and character references, and rejects anything else.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "ckptfs/s3.hpp"

namespace ckptfs::s3 {

struct XmlError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The decoded text of the first <tag>...</tag> in `xml`; nullopt when there is none.
std::optional<std::string> xml_text(std::string_view xml, std::string_view tag);

// A ListObjectsV2 result page; throws XmlError when a <Contents> lacks a key or size or a field is malformed.
ListPage parse_list_page(std::string_view xml);

// The <Code> of an S3 <Error> body ("" when the body is not one).
std::string parse_error_code(std::string_view xml);

}  // namespace ckptfs::s3
