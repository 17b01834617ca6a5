#include "s3/xml.hpp"

#include <fmt/format.h>

#include <charconv>

namespace ckptfs::s3 {
namespace {

// The content of the first <tag>...</tag> at or after `from`; `from` is moved past it.
std::optional<std::string_view> next_element(std::string_view xml, std::string_view tag, std::size_t& from) {
  std::string open = fmt::format("<{}>", tag), close = fmt::format("</{}>", tag);
  std::size_t b = xml.find(open, from);
  if (b == xml.npos) return std::nullopt;
  b += open.size();
  std::size_t e = xml.find(close, b);
  if (e == xml.npos) throw XmlError(fmt::format("<{}> is not closed", tag));
  from = e + close.size();
  return xml.substr(b, e - b);
}

void append_utf8(std::string& out, unsigned long cp) {
  if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    throw XmlError(fmt::format("invalid character reference U+{:X}", cp));
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string decode_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') throw XmlError("unexpected element inside a text field");
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    std::size_t semi = s.find(';', i);
    if (semi == s.npos) throw XmlError("unterminated entity");
    std::string_view name = s.substr(i + 1, semi - i - 1);
    if (name == "amp")
      out += '&';
    else if (name == "lt")
      out += '<';
    else if (name == "gt")
      out += '>';
    else if (name == "quot")
      out += '"';
    else if (name == "apos")
      out += '\'';
    else if (name.size() > 1 && name[0] == '#') {
      bool hex = name[1] == 'x' || name[1] == 'X';
      std::string_view digits = name.substr(hex ? 2 : 1);
      unsigned long cp = 0;
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
      if (ec != std::errc{} || end != digits.data() + digits.size() || digits.empty())
        throw XmlError(fmt::format("invalid character reference &{};", name));
      append_utf8(out, cp);
    } else {
      throw XmlError(fmt::format("unknown entity &{};", name));
    }
    i = semi;
  }
  return out;
}

std::uint64_t parse_size(std::string_view s) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || s.empty())
    throw XmlError(fmt::format("<Size> '{}' is not a byte count", s));
  return v;
}

std::string required(std::string_view xml, std::string_view tag, std::string_view where) {
  auto v = xml_text(xml, tag);
  if (!v) throw XmlError(fmt::format("{} has no <{}>", where, tag));
  return *v;
}

}  // namespace

std::optional<std::string> xml_text(std::string_view xml, std::string_view tag) {
  std::size_t from = 0;
  auto e = next_element(xml, tag, from);
  if (!e) return std::nullopt;
  return decode_text(*e);
}

ListPage parse_list_page(std::string_view xml) {
  if (xml.find("<ListBucketResult") == xml.npos) throw XmlError("not a ListBucketResult");
  ListPage page;
  std::size_t from = 0;
  while (auto contents = next_element(xml, "Contents", from)) {
    ObjectInfo o;
    o.key = required(*contents, "Key", "<Contents>");
    o.size = parse_size(required(*contents, "Size", "<Contents>"));
    o.etag = xml_text(*contents, "ETag").value_or("");
    o.last_modified = xml_text(*contents, "LastModified").value_or("");
    page.objects.push_back(std::move(o));
  }
  // (no <Contents> child has these: an XML-escaped key cannot fake one)
  std::string truncated = xml_text(xml, "IsTruncated").value_or("false");
  if (truncated != "true" && truncated != "false")
    throw XmlError(fmt::format("<IsTruncated> '{}'", truncated));
  page.truncated = truncated == "true";
  page.next_continuation_token = xml_text(xml, "NextContinuationToken").value_or("");
  if (page.truncated && page.next_continuation_token.empty())
    throw XmlError("a truncated page without <NextContinuationToken>");
  return page;
}

std::string parse_error_code(std::string_view xml) {
  if (xml.find("<Error>") == xml.npos) return "";
  try {
    return xml_text(xml, "Code").value_or("");
  } catch (const XmlError&) {
    return "";
  }
}

}  // namespace ckptfs::s3
