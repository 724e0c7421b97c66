// What a worker's one log line per request (GenerateReactor::LogEnd) says about how the request
// ended, computed apart from the reactor so it can be tested without scraping logs.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_END_LOG_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_END_LOG_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "services/worker/engine/request.h"

namespace lazyattn {

struct RequestEndLogFields {
  // ttft_s: seconds from the call's arrival at the worker to its first token, as the Final's
  // ttft_ms and lazyattn_worker_ttft_seconds count it, whether the call then succeeded or failed
  // (a stream cut after its first tokens had a first token). Absent, and the line without the
  // key, when the call produced none.
  std::optional<double> ttft_s;
  std::optional<std::string> finish_reason;  // on success only: "stop" or "length"
  std::optional<std::string> error;          // on failure only: the status's message
};

// `first_token_ms`: the reactor's arrival-to-first-token time in milliseconds, negative when no
// token came (a success without a token counts its end, as its Final does).
RequestEndLogFields RequestEndLogFieldsOf(const absl::Status& status, const RequestResult& result,
                                          double first_token_ms);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_END_LOG_H_
