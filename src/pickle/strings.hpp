// Text decoding for the pickle reader: UTF-8 checks, latin-1, and the escaped forms protocol 0 writes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ckptfs::pickle {

// Well-formed UTF-8, surrogates allowed (Python decodes pickled str with 'surrogatepass').
bool is_utf8(std::string_view text);
void append_utf8(std::string& out, uint32_t code_point);
// Code points of a UTF-8 string as latin-1 bytes (what _codecs.encode(s, 'latin1') returns); nullopt when
// a code point is above U+00FF.
std::optional<std::string> utf8_to_latin1(std::string_view text);
// Python's codecs.escape_decode, used by the STRING opcode on the text between the quotes.
std::optional<std::string> decode_escaped_bytes(std::string_view text);
// Python's 'raw-unicode-escape' decoding (UNICODE opcode), returned as UTF-8.
std::optional<std::string> decode_raw_unicode_escape(std::string_view text);

}  // namespace ckptfs::pickle
