// Worker ids: how kvdir names a worker (its entries, its lease, the certificate bound to it) and
// routers count calls and breakers. kvdir takes 1 to limits.max_worker_id_length (255 by default)
// of [A-Za-z0-9._:[]-]: enough for host:port, [v6]:port and StatefulSet names, and nothing that
// reads differently in a log line, a metric label or a URI path.
#ifndef LAZYATTN_COMMON_WORKER_ID_H_
#define LAZYATTN_COMMON_WORKER_ID_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace lazyattn {

inline constexpr size_t kDefaultMaxWorkerIdLength = 255;

// One of [A-Za-z0-9._:[]-].
bool IsWorkerIdChar(char c);

// 1 to `max_length` characters, each IsWorkerIdChar.
bool IsValidWorkerId(absl::string_view id, size_t max_length = kDefaultMaxWorkerIdLength);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_WORKER_ID_H_
