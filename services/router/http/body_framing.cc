#include "services/router/http/body_framing.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/router/http/openai_fields.h"

namespace lazyattn::router {
namespace {

BodyFraming Refuse(int status, std::string message, std::string code) {
  BodyFraming f;
  f.error_status = status;
  f.message = std::move(message);
  f.code = std::move(code);
  return f;
}

}  // namespace

// RFC 9110's Content-Length = 1*DIGIT; a sign or a space inside is not one (strtoull would read
// "-1" as 2^64 - 1 and "12abc" as 12). A value beyond int64 saturates: it is over any limit.
bool ParseContentLength(absl::string_view text, int64_t* out) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return false;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    if (value > (INT64_MAX - 9) / 10) {
      value = INT64_MAX;
    } else {
      value = value * 10 + (c - '0');
    }
  }
  *out = value;
  return true;
}

std::string BodyTooLargeMessage(int64_t max_body_bytes) {
  return absl::StrCat("body: larger than http.max_body_bytes (", max_body_bytes, " bytes)");
}

BodyFraming CheckContentType(const std::vector<std::string>& content_type) {
  if (content_type.empty()) return BodyFraming{};
  if (content_type.size() > 1) {
    return Refuse(400, "Content-Type: given more than once", "invalid_argument");
  }
  const absl::string_view value = content_type[0];
  const absl::string_view media = absl::StripAsciiWhitespace(value.substr(0, value.find(';')));
  if (absl::EqualsIgnoreCase(media, "application/json")) return BodyFraming{};
  return Refuse(415,
                absl::StrCat("Content-Type: expected application/json, got \"",
                             TruncateUtf8(std::string(value), kQuotedBytes), "\""),
                "unsupported_media_type");
}

BodyFraming CheckContentEncoding(const std::vector<std::string>& content_encoding) {
  if (content_encoding.empty()) return BodyFraming{};
  const absl::string_view value =
      content_encoding.size() == 1 ? absl::StripAsciiWhitespace(content_encoding[0]) : "";
  if (content_encoding.size() == 1 && (absl::EqualsIgnoreCase(value, "identity") ||
                                       value == "gzip" || value == "deflate" || value == "br")) {
    return BodyFraming{};
  }
  const std::string given =
      content_encoding.size() == 1 ? TruncateUtf8(content_encoding[0], kQuotedBytes) : "";
  return Refuse(
      415,
      content_encoding.size() > 1
          ? std::string("Content-Encoding: given more than once; send one of gzip, "
                        "deflate, br or identity")
          : absl::StrCat("Content-Encoding: expected gzip, deflate, br or identity, got \"", given,
                         "\""),
      "unsupported_media_type");
}

BodyFraming CheckBodyFraming(const std::vector<std::string>& content_length,
                             const std::vector<std::string>& transfer_encoding, bool body_required,
                             int64_t max_body_bytes) {
  if (!transfer_encoding.empty()) {
    if (transfer_encoding.size() != 1 ||
        !absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(transfer_encoding[0]), "chunked")) {
      return Refuse(501, "Transfer-Encoding: only \"chunked\" is supported", "not_implemented");
    }
    if (!content_length.empty()) {
      return Refuse(400, "Content-Length: not allowed with Transfer-Encoding", "invalid_argument");
    }
    BodyFraming f;
    f.kind = BodyFraming::Kind::kChunked;
    return f;
  }
  if (content_length.size() > 1) {
    return Refuse(400, "Content-Length: given more than once", "invalid_argument");
  }
  if (content_length.size() == 1) {
    BodyFraming f;
    if (!ParseContentLength(content_length[0], &f.length)) {
      return Refuse(400, "Content-Length: not a non-negative decimal integer", "invalid_argument");
    }
    if (f.length > max_body_bytes) {
      return Refuse(413, BodyTooLargeMessage(max_body_bytes), "body_too_large");
    }
    f.kind = BodyFraming::Kind::kLength;
    return f;
  }
  if (body_required) {
    return Refuse(411, "Content-Length: required (or Transfer-Encoding: chunked)",
                  "length_required");
  }
  return BodyFraming{};
}

}  // namespace lazyattn::router
