#include "pickle/strings.hpp"

namespace ckptfs::pickle {

namespace {

// Decodes one UTF-8 sequence at `pos`; nullopt when malformed.
std::optional<uint32_t> next_code_point(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  size_t len = 0;
  uint32_t cp = 0;
  if (b0 < 0x80) {
    ++pos;
    return b0;
  } else if ((b0 & 0xe0) == 0xc0) {
    len = 2, cp = b0 & 0x1f;
  } else if ((b0 & 0xf0) == 0xe0) {
    len = 3, cp = b0 & 0x0f;
  } else if ((b0 & 0xf8) == 0xf0) {
    len = 4, cp = b0 & 0x07;
  } else {
    return std::nullopt;
  }
  if (s.size() - pos < len) return std::nullopt;
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<uint8_t>(s[pos + i]);
    if ((b & 0xc0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (b & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10ffff) return std::nullopt;  // overlong or out of range
  pos += len;
  return cp;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool is_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();)
    if (!next_code_point(text, pos)) return false;
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::optional<std::string> utf8_to_latin1(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    auto cp = next_code_point(text, pos);
    if (!cp || *cp > 0xff) return std::nullopt;
    out.push_back(static_cast<char>(*cp));
  }
  return out;
}

std::optional<std::string> decode_escaped_bytes(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out.push_back(text[i]);
      continue;
    }
    if (++i == text.size()) return std::nullopt;  // trailing backslash
    const char c = text[i];
    switch (c) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x': {
        if (text.size() - i < 3) return std::nullopt;
        int hi = hex_digit(text[i + 1]), lo = hex_digit(text[i + 2]);
        if (hi < 0 || lo < 0) return std::nullopt;
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          int v = c - '0';
          for (int n = 1; n < 3 && i + 1 < text.size() && text[i + 1] >= '0' && text[i + 1] <= '7'; ++n)
            v = v * 8 + (text[++i] - '0');
          out.push_back(static_cast<char>(v & 0xff));
        } else {
          out.push_back('\\');  // unknown escapes are kept as they are
          out.push_back(c);
        }
    }
  }
  return out;
}

std::optional<std::string> decode_raw_unicode_escape(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text[i] != '\\') {
      append_utf8(out, static_cast<uint8_t>(text[i++]));
      continue;
    }
    // Only an odd run of backslashes followed by u/U starts an escape.
    size_t run = 0;
    while (i < text.size() && text[i] == '\\') ++run, ++i;
    const bool escape = run % 2 == 1 && i < text.size() && (text[i] == 'u' || text[i] == 'U');
    out.append(escape ? run - 1 : run, '\\');
    if (!escape) continue;
    const size_t digits = text[i] == 'u' ? 4 : 8;
    if (text.size() - i - 1 < digits) return std::nullopt;
    uint32_t cp = 0;
    for (size_t k = 1; k <= digits; ++k) {
      int d = hex_digit(text[i + k]);
      if (d < 0) return std::nullopt;
      cp = cp * 16 + static_cast<uint32_t>(d);
    }
    if (cp > 0x10ffff) return std::nullopt;
    append_utf8(out, cp);
    i += digits + 1;
  }
  return out;
}

}  // namespace ckptfs::pickle
