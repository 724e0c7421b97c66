// The bytes of a request's line and header section, checked as cpp-httplib reads them (a byte at
// a time, through the router's stream: connection_stream.h) for what the library lets through or
// drops without a word, and which a proxy in front could read otherwise (RFC 9112 sections 2.2,
// 3 and 5; RFC 9110 section 5.5):
//
//   a line ending in a bare LF           the library skips such a header line (and a bare-LF
//                                        blank line does not end the head for it), while a proxy
//                                        that accepts bare LF, as RFC 9112 lets it, reads the line
//   a CR not followed by LF (bare CR)    kept inside the value: `X-A: a\rContent-Length: 0` is
//                                        two fields to a parser that ends lines at CR
//   a NUL in a header value              RFC 9110 section 5.5: refuse (or replace)
//   a header line without a colon        dropped by the library; a proxy may refuse or fold it
//   a header line that begins with SP    obs-fold (a folded value), which RFC 9112 section 5.2
//     or HTAB                            lets a server refuse; the library drops or misreads it
//   a control byte in the request line   none belongs there (the library splits on SP only)
//   a '%' in the value of Content-Length, the library percent-decodes every header value, so
//     Transfer-Encoding, Content-Encoding, `Content-Length: 1%30` would be 10 to the router and
//     Content-Type, Host, Authorization,  invalid to a proxy; none of these fields has a use
//     Connection or Expect                for '%'
//
// Bare LF is refused everywhere, never taken as a line end: the library itself ends lines only at
// CRLF, so a recipient that took LF alone would read the request otherwise than the library does.
// The chunked body's lines follow the same rule (chunked_body_checker.h).
//
// What the parsed headers show is checked there (request_head_checks.h): a field name that is no
// token (a NUL or a space in it included), Host, Content-Length and the rest. Other control bytes
// in a header value are kept, as RFC 9110 section 5.5 allows.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HEAD_LINE_CHECKER_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HEAD_LINE_CHECKER_H_

#include <cstddef>
#include <string>

namespace lazyattn::router {

class HeadLineChecker {
 public:
  // One more byte of the head, in order. False once a problem is found (at this byte or earlier);
  // the checker still follows the request line to its end (in_request_line), so that the router
  // can let the library finish it and answer 400 (a request line cut short is closed without an
  // answer). Bytes after the blank line that ends the head are ignored.
  bool Feed(char c);

  bool failed() const { return !problem_.empty(); }
  // What was wrong, for the 400's message ("header \"X-A\": a NUL in its value"); empty when
  // nothing was.
  const std::string& problem() const { return problem_; }
  // The request line (the head's first line) is not yet complete.
  bool in_request_line() const { return line_ == 0; }
  // The problem was found in the request line.
  bool failed_in_request_line() const { return failed() && problem_line_ == 0; }
  // The blank line that ends the head was fed.
  bool done() const { return done_; }

 private:
  void Fail(std::string problem);
  // The line as read so far, quoted for a message (the field's name in a value's problem).
  std::string Quoted() const;
  void EndLine();

  std::string problem_;
  size_t problem_line_ = 0;
  size_t line_ = 0;        // 0: the request line
  size_t line_bytes_ = 0;  // bytes of this line so far, its line end excluded
  std::string start_;      // the line's first bytes (its name), for messages
  bool colon_ = false;     // a header line's colon was read: the value follows
  bool cr_ = false;        // the last byte was a CR
  bool done_ = false;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HEAD_LINE_CHECKER_H_
