// The router's byte-level HTTP checks (services/router/http): the request head checker and the
// chunked body checker, fed what a client could send. Besides not crashing, each checker must
// reach the same verdict (failed, done, the problem's text) however the bytes are split into
// reads: the library reads a head a byte at a time but a body in reads of any size, and a split
// must never turn a refused body into an accepted one. The first byte picks the split points.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "services/router/http/chunked_body_checker.h"
#include "services/router/http/head_line_checker.h"

namespace {

using lazyattn::router::ChunkedBodyChecker;
using lazyattn::router::HeadLineChecker;

void CheckHead(std::string_view bytes) {
  HeadLineChecker c;
  bool ok = true;
  for (const char ch : bytes) {
    const bool fed = c.Feed(ch);
    if (!ok && fed) __builtin_trap();  // once refused, refused for good
    ok = fed;
  }
  if (c.failed() != !c.problem().empty()) __builtin_trap();
  if (c.failed_in_request_line() && !c.failed()) __builtin_trap();
}

void CheckChunked(std::string_view bytes, unsigned split_seed) {
  ChunkedBodyChecker whole;
  whole.Feed(bytes.data(), bytes.size());
  ChunkedBodyChecker split;
  size_t at = 0;
  unsigned state = split_seed | 1;
  while (at < bytes.size()) {
    state = state * 1103515245u + 12345u;
    const size_t n = std::min<size_t>(bytes.size() - at, 1 + (state >> 16) % 9);
    split.Feed(bytes.data() + at, n);
    at += n;
  }
  if (whole.failed() != split.failed() || whole.done() != split.done() ||
      whole.problem() != split.problem() || whole.has_trailer() != split.has_trailer()) {
    __builtin_trap();
  }
  if (whole.failed() != !whole.problem().empty()) __builtin_trap();
  if (whole.done() && whole.failed()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 16)) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  CheckHead(bytes);
  CheckChunked(bytes, data[0]);
  return 0;
}
