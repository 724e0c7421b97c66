// A chunked request body's framing (RFC 9112 section 7.1), checked byte by byte as cpp-httplib
// reads it through the router's stream (connection_stream.h), so that a read breaking it fails and
// the request is refused 400 (http_server.cc) instead of read the library's way:
//
//   chunked-body = *chunk last-chunk trailer-section CRLF
//   chunk        = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
//   chunk-size   = 1*HEXDIG            (upper or lower case, leading zeros allowed)
//   last-chunk   = 1*("0") [ chunk-ext ] CRLF
//   chunk-ext    = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] )   ext-val: token or
//                                                                      quoted-string
//   trailer-section = *( field-line CRLF )
//
// cpp-httplib 0.11 reads a size with strtoul, which took `0x3f`, `+3f` and ` 3f` as 63 and `-5` as
// 2^64 - 5 (a body awaited until the body timeout); it ended the body early, as if complete, at
// anything but CRLF after a chunk's data (`XX0\r\n` after it was dropped); and it took a bare LF
// after the data the same way. A proxy in front that reads the body otherwise would see another
// request where the router saw the end of this one.
//
// Refused besides the grammar: a size of more than kMaxSizeDigits significant hex digits (no
// overflow, and no body that large is read: http.max_body_bytes bounds it long before); a bare LF
// or a bare CR anywhere a line ends (head_line_checker.h says why bare LF is never a line end);
// obs-fold, a NUL or a bare CR in a trailer field. Trailer fields that parse pass here; the
// library refuses them after (has_trailer tells the router why its read failed).
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_CHUNKED_BODY_CHECKER_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_CHUNKED_BODY_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace lazyattn::router {

class ChunkedBodyChecker {
 public:
  // A chunk size's significant hex digits (leading zeros not counted): sizes below 2^60.
  static constexpr int kMaxSizeDigits = 15;

  // The next `size` bytes of the body, in order, split anyhow. False once the framing is broken
  // (by these bytes or earlier). Bytes after the body's end (done) are not the body's: false.
  bool Feed(const char* data, size_t size);

  bool failed() const { return !problem_.empty(); }
  // What was wrong ("chunk size: expected a hex digit, got \"+\""); empty when nothing was.
  const std::string& problem() const { return problem_; }
  // The body's last CRLF was fed, and nothing after it: it is complete.
  bool done() const { return state_ == State::kDone && !failed(); }
  // A trailer field line began after the last chunk.
  bool has_trailer() const { return has_trailer_; }

 private:
  enum class State {
    kSizeStart,      // a chunk's first size digit
    kSize,           // more size digits, an extension, or the line's CR
    kExtBws,         // whitespace after the size or an extension: ";" must follow
    kExtNameStart,   // after ";": whitespace, then an extension's name
    kExtName,        // its name
    kExtAfterName,   // whitespace after the name: "=" or ";" must follow
    kExtValueStart,  // after "=": whitespace, then a token or a quoted string
    kExtToken,       // a token value
    kExtQuoted,      // inside a quoted value
    kExtQuotedPair,  // after a backslash in it
    kExtAfterValue,  // after a quoted value's closing quote
    kSizeLf,         // the LF ending a size line
    kData,           // chunk data: `left_` bytes to go
    kDataCr,         // the CR after a chunk's data
    kDataLf,         // and its LF
    kTrailerStart,   // a trailer field line, or the CR of the body's final CRLF
    kTrailerName,    // a trailer field's name
    kTrailerValue,   // its value, to the line's CR
    kTrailerLf,      // the LF ending a trailer field line
    kFinalLf,        // the LF of the body's final CRLF
    kDone,
  };

  void Fail(std::string problem);
  // Feeds one byte that is not chunk data.
  void Step(unsigned char c);
  // A size or extension line's CR was read: its LF must follow.
  void EndSizeLine() { state_ = State::kSizeLf; }

  State state_ = State::kSizeStart;
  std::string problem_;
  uint64_t size_ = 0;    // the size being read
  int size_digits_ = 0;  // its significant digits
  uint64_t chunk_ = 0;   // the current chunk's size
  uint64_t left_ = 0;    // its data bytes still to come
  bool has_trailer_ = false;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_CHUNKED_BODY_CHECKER_H_
