#include "services/router/http/sse_writer.h"

namespace lazyattn::router {

std::string SseEvent(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  size_t start = 0;
  while (true) {
    // A field ends at CR, LF or CRLF; each line of the payload becomes its own data field.
    size_t end = payload.find_first_of("\r\n", start);
    out += "data: ";
    out.append(payload.substr(start, end == std::string_view::npos ? end : end - start));
    out += '\n';
    if (end == std::string_view::npos) break;
    if (payload[end] == '\r' && end + 1 < payload.size() && payload[end + 1] == '\n') ++end;
    start = end + 1;
  }
  out += '\n';
  return out;
}

bool SseWriter::Raw(std::string_view bytes) {
  if (!ok_) return false;
  ok_ = sink_(bytes.data(), bytes.size());
  return ok_;
}

}  // namespace lazyattn::router
