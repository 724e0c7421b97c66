// Metrics every process exports beside its service's own (common/metrics.h serves them):
//
//   process_cpu_seconds_total        user + system CPU time       (/proc/self/stat utime+stime)
//   process_resident_memory_bytes    resident set size            (/proc/self/stat rss * page)
//   process_virtual_memory_bytes     virtual memory size          (/proc/self/stat vsize)
//   process_open_fds                 open file descriptors        (entries of /proc/self/fd)
//   process_max_fds                  the soft RLIMIT_NOFILE
//   process_start_time_seconds       start, seconds since the Unix epoch (stat starttime / ticks
//                                    + btime of /proc/stat)
//   lazyattn_build_info{version,git_sha,cuda} = 1
//
// The names and meanings are the Prometheus client libraries' standard process collector, so
// dashboards written for other services work unchanged. Values are read at scrape time.
#ifndef LAZYATTN_COMMON_PROCESS_METRICS_H_
#define LAZYATTN_COMMON_PROCESS_METRICS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

namespace lazyattn {

struct ProcessStats {
  double cpu_seconds = 0;
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double start_time_seconds = 0;
};

// Parses the contents of /proc/<pid>/stat (the command name may hold spaces and parentheses).
// `ticks` is sysconf(_SC_CLK_TCK), `page` the page size, `boot_time` /proc/stat's btime.
// nullopt when the text is not a stat line.
std::optional<ProcessStats> ParseProcStat(const std::string& stat, double ticks, double page,
                                          double boot_time);

class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// A registry holding lazyattn_build_info with this binary's version, git commit and whether
// the CUDA backend was compiled in (values fixed at configure time by CMake).
std::shared_ptr<prometheus::Registry> BuildInfoRegistry();

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_PROCESS_METRICS_H_
