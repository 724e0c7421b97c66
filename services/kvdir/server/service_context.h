// What the RPC handlers of the directory share. Owned by KvdirServer, which outlives every RPC
// (it shuts the gRPC server down, waiting for all reactors, before destroying these).
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_SERVICE_CONTEXT_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_SERVICE_CONTEXT_H_

#include <cstdint>

#include "services/kvdir/index/directory_index.h"
#include "services/kvdir/server/kvdir_metrics.h"

namespace lazyattn::kvdir {

struct ServiceContext {
  DirectoryIndex* index = nullptr;
  KvdirMetrics* metrics = nullptr;
  int64_t lease_ms = 3000;
  int max_keys_per_lookup = 1024;
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_SERVICE_CONTEXT_H_
