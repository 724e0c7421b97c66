#include "services/router/http/http_syntax.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace lazyattn::router {

bool IsTokenChar(unsigned char c) {
  // (Not strchr: it finds a NUL, the string's own end, in any string.)
  constexpr std::string_view kSymbols = "!#$%&'*+-.^_`|~";
  return absl::ascii_isalnum(c) ||
         (c != 0 && kSymbols.find(static_cast<char>(c)) != std::string_view::npos);
}

std::string QuoteBytes(std::string_view bytes, size_t max_bytes) {
  std::string out = "\"";
  for (size_t i = 0; i < bytes.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  if (bytes.size() > max_bytes) out += "...";
  out += "\"";
  return out;
}

}  // namespace lazyattn::router
