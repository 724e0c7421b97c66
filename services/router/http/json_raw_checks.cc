#include "services/router/http/json_raw_checks.h"

#include "absl/strings/str_cat.h"

namespace lazyattn::router {

absl::Status CheckRawJson(std::string_view body, int max_depth, int64_t max_elements) {
  int depth = 0;  // containers open around the next byte
  int64_t elements = 0;  // containers opened and separators seen
  bool in_string = false;
  bool escaped = false;  // the previous byte was a backslash inside a string
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("body: not valid JSON (a NUL byte at offset ", i, ")"));
    }
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == ']' || c == '}') {
      if (depth > 0) --depth;  // an unmatched one is the parser's error
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    // Anything else begins a value, a key or a separator; past the limit only the closing of the
    // innermost container may come (a separator cannot, as no value came before it).
    if (depth > max_depth) {
      return absl::InvalidArgumentError(
          absl::StrCat("body: JSON nested deeper than ", max_depth, " levels"));
    }
    if (c == '[' || c == '{' || c == ',') {
      if (++elements > max_elements) {
        return absl::InvalidArgumentError(absl::StrCat(
            "body: more than ", max_elements,
            " JSON values (lists, objects and their entries); no request needs that many"));
      }
      if (c != ',') ++depth;
    } else if (c == '"') {
      in_string = true;
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyattn::router
