// What the RPC handlers of the directory share. Owned by KvdirServer, which outlives every RPC
// (it shuts the gRPC server down, waiting for all reactors, before destroying these).
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_SERVICE_CONTEXT_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_SERVICE_CONTEXT_H_

#include <cstdint>

#include "services/kvdir/index/directory_index.h"
#include "services/kvdir/server/kvdir_metrics.h"
#include "services/kvdir/server/publish_streams.h"
#include "services/kvdir/server/slow_work_pool.h"

namespace lazyattn::kvdir {

struct ServiceContext {
  DirectoryIndex* index = nullptr;
  KvdirMetrics* metrics = nullptr;
  PublishStreams* streams = nullptr;  // null: no stream bounds (tests of the index alone)
  // Where snapshots and hellos are handled; null: on the reactor's own (gRPC's) thread.
  SlowWorkPool* slow_work = nullptr;
  int64_t lease_ms = 3000;
  int max_keys_per_lookup = 1024;
  int64_t max_entries_per_worker = 262'144;  // also in the index; checked before decoding
  int64_t max_entries = 2'097'152;           // in the index; named in its refusal
  int max_worker_id_length = 255;
  int max_status_bytes = 65'536;  // hello.status: kept per worker, returned by every Lookup
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_SERVICE_CONTEXT_H_
