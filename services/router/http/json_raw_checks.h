// What the JSON parser cannot be trusted with, found in one linear pass over a request's raw body
// before it is parsed (openai_json.cc, ParseOpenAiRequest):
//   - nesting deeper than `max_depth`. nlohmann 3.11 can bound depth only through a parse
//     callback, with which its DOM parser rescans the enclosing container whenever an object
//     closes: quadratic (4 MB of `{},` took minutes of a connection thread). The rule is the
//     parser's: a value may have at most `max_depth` containers around it, so the innermost of
//     `max_depth` + 1 nested containers may only be empty. Brackets inside strings (escapes
//     included) are text, not nesting.
//   - a raw NUL byte: nlohmann's lexer reads it as the end of the input, so `{...}\0<anything>`
//     parsed as `{...}`. JSON has no place for one (inside a string it must be escaped).
//   - more than `max_elements` containers and separators (each '[', '{' and ',' outside strings,
//     which bound the values and members parsed): the DOM costs 16-64 bytes a value, so 4 MiB of
//     `[{},{},...]` took ~40 times its size (160 MB a request, several GB with every HTTP thread
//     at it, much of it kept by the allocator afterwards), while a request the API takes has a few
//     thousand values.
// Each is INVALID_ARGUMENT naming `body`; any other fault is the parser's to find.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_JSON_RAW_CHECKS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_JSON_RAW_CHECKS_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace lazyattn::router {

absl::Status CheckRawJson(std::string_view body, int max_depth, int64_t max_elements);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_JSON_RAW_CHECKS_H_
