// Numbers beyond a double's range in a JSON request. nlohmann refuses a body holding one (1e400,
// -1E+999) as a parse error (its error 406), so the request would be refused as "not valid JSON"
// though its grammar is; this finds the number, as written, and the field it is in, so the
// message names them instead.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_JSON_NUMBERS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_JSON_NUMBERS_H_

#include <optional>
#include <string>
#include <string_view>

namespace lazyattn::router {

struct OutOfRangeNumber {
  // Where it is, as the request's error messages name fields: "n", "messages[0].content",
  // "stream_options.x"; an entry of logit_bias by its key ("logit_bias: key \"7\"", so that
  // `param` is logit_bias). Keys are cut to kMaxFieldNameBytes; "body" for a bare number.
  std::string field;
  std::string text;  // as written ("1e400"), cut to kQuotedBytes
};

// The first number in `body` that a double cannot hold, if the text up to it is valid JSON nested
// at most `max_depth` deep; nullopt otherwise (a body that fails for another reason first).
std::optional<OutOfRangeNumber> FindOutOfRangeNumber(std::string_view body, int max_depth);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_JSON_NUMBERS_H_
