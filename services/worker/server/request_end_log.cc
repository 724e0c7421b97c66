#include "services/worker/server/request_end_log.h"

namespace lazyattn {

RequestEndLogFields RequestEndLogFieldsOf(const absl::Status& status, const RequestResult& result,
                                          double first_token_ms) {
  RequestEndLogFields fields;
  // The reactor's own time, not result.ttft_ms: the engine's counts from submission (after
  // tokenizing) and is left at 0 for a request that never reached the engine.
  if (first_token_ms >= 0) fields.ttft_s = first_token_ms / 1000.0;
  if (status.ok()) {
    fields.finish_reason = result.finish_reason;
  } else {
    fields.error.emplace(status.message());
  }
  return fields;
}

}  // namespace lazyattn
