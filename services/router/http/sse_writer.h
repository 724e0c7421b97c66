// Server-sent events framing (the WHATWG "text/event-stream" format) for streamed completions:
// each event is `data: <payload>\n\n`, the stream ends with OpenAI's `data: [DONE]\n\n`. A payload
// with line breaks is split into one `data:` line per line, so a client reassembles it exactly.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_SSE_WRITER_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_SSE_WRITER_H_

#include <functional>
#include <string>
#include <string_view>

namespace lazyattn::router {

std::string SseEvent(std::string_view payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// Writes events to a byte sink (the HTTP response body); once a write fails (the client went
// away, or the write timeout passed) every later write fails too without touching the sink.
class SseWriter {
 public:
  using Sink = std::function<bool(const char* data, size_t size)>;
  explicit SseWriter(Sink sink) : sink_(std::move(sink)) {}

  bool Event(std::string_view payload) { return Raw(SseEvent(payload)); }
  bool Done() { return Raw(kSseDone); }
  bool ok() const { return ok_; }

 private:
  bool Raw(std::string_view bytes);

  Sink sink_;
  bool ok_ = true;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_SSE_WRITER_H_
