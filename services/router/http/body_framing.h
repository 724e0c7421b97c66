// How a request's body is delimited, checked from its headers before any of it is read, so that a
// body the router will refuse is never buffered and a request whose length is ambiguous (the
// request-smuggling shapes of RFC 9112 section 6.3) is refused instead of guessed:
//
//   Transfer-Encoding other than a single "chunked"      501 (the only coding the router reads)
//   Transfer-Encoding and Content-Length together        400
//   Content-Length twice, or not a decimal integer >= 0  400
//   Content-Length over the limit                        413 at once (the body is not read)
//   neither, on a request that needs a body              411
//
// A chunked body has no length up front: its reader counts the bytes and stops at the limit
// (http_server.cc), so that case passes here as kChunked.
//
// The body's type is checked the same way (CheckContentType): the endpoints read JSON only, and
// cpp-httplib would parse a multipart/form-data body itself (and fail) before the handler saw it.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_BODY_FRAMING_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_BODY_FRAMING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace lazyattn::router {

struct BodyFraming {
  enum class Kind { kNone, kLength, kChunked };
  Kind kind = Kind::kNone;
  int64_t length = 0;  // kLength: the announced length

  // Set when the request is refused: the HTTP status, a message naming the header (and the limit
  // for 413) and the error body's `code`.
  int error_status = 0;
  std::string message;
  std::string code;
  bool ok() const { return error_status == 0; }
};

// `content_length`, `transfer_encoding`: the values of every header of that name, in order.
// `body_required`: the endpoint reads a body (no framing at all is then 411). `max_body_bytes`:
// http.max_body_bytes.
BodyFraming CheckBodyFraming(const std::vector<std::string>& content_length,
                             const std::vector<std::string>& transfer_encoding, bool body_required,
                             int64_t max_body_bytes);

// `content_type`: the values of every Content-Type header. Accepted: none (clients that omit it
// send JSON all the same), or one whose media type is application/json (any case, parameters
// such as charset allowed). Refused: another media type, 415 naming Content-Type and quoting the
// value (cut to 32 bytes); the header given twice, 400.
BodyFraming CheckContentType(const std::vector<std::string>& content_type);

// `content_encoding`: the values of every Content-Encoding header. Accepted: none, or one of
// `identity` (any case), `gzip`, `deflate`, `br` (exactly as written: the spellings cpp-httplib
// decodes, after which http.max_body_bytes applies to the decoded body). Refused with 415 naming
// Content-Encoding and quoting the value (cut to 32 bytes): any other coding, a list of codings,
// or the header given twice. cpp-httplib would read such a body as it came, undecoded, and a
// zstd body would then reach the JSON parser as bytes.
BodyFraming CheckContentEncoding(const std::vector<std::string>& content_encoding);

// A Content-Length value: decimal digits (surrounding blanks allowed), saturating at INT64_MAX.
bool ParseContentLength(absl::string_view text, int64_t* out);

// The 413 message for a body over the limit, whether announced or counted.
std::string BodyTooLargeMessage(int64_t max_body_bytes);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_BODY_FRAMING_H_
