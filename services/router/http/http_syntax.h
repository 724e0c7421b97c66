// Small pieces of HTTP/1.1's grammar (RFC 9110 section 5.6.2) shared by the checks that read a
// request's bytes (head_line_checker.h, chunked_body_checker.h) and its parsed headers
// (request_head_checks.h), and the quoting their messages use for client bytes.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SYNTAX_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SYNTAX_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace lazyattn::router {

// tchar: a letter, a digit or one of !#$%&'*+-.^_`|~ (what a field name or a chunk extension's
// name is made of).
bool IsTokenChar(unsigned char c);

// `bytes` in double quotes for an error message: printable ASCII as it came, any other byte (and
// `"`, `\`) as \xNN; cut after `max_bytes` bytes, then "..." inside the quotes.
std::string QuoteBytes(std::string_view bytes, size_t max_bytes);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SYNTAX_H_
