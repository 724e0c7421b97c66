// The host memory a worker process may still take, for checks made before it allocates much
// (the CPU backend's KV pool): Linux overcommits, so a pool larger than the machine is not refused
// by the allocator; zeroing it grows the process until the kernel's OOM killer ends it.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_HOST_MEMORY_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_HOST_MEMORY_H_

#include <cstdint>
#include <string_view>

namespace lazyattn {

// Bytes of `MemAvailable:` in a /proc/meminfo text; -1 when absent or malformed.
int64_t MemAvailableBytes(std::string_view meminfo);

// Bytes of `inactive_file` in a cgroup v2 memory.stat text (page cache the kernel reclaims
// first); 0 when absent.
int64_t CgroupInactiveFileBytes(std::string_view memory_stat);

// The smaller of /proc/meminfo's MemAvailable and, in a cgroup v2 container with a limit, its
// memory.max less what it uses (memory.current without its inactive page cache); -1 when
// neither can be read.
int64_t AvailableHostMemoryBytes();

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_HOST_MEMORY_H_
