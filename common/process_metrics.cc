#include "common/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <prometheus/gauge.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

#ifndef LAZYATTN_VERSION
#define LAZYATTN_VERSION "unknown"
#endif
#ifndef LAZYATTN_GIT_SHA
#define LAZYATTN_GIT_SHA "unknown"
#endif
#ifndef LAZYATTN_BUILD_CUDA
#define LAZYATTN_BUILD_CUDA "unknown"
#endif

namespace lazyattn {
namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

double BootTime() {
  std::istringstream in(ReadFile("/proc/stat"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("btime ", 0) == 0) {
      double t = 0;
      if (absl::SimpleAtod(line.substr(6), &t)) return t;
    }
  }
  return 0;
}

int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the descriptor opendir itself holds
}

prometheus::MetricFamily Gauge(const std::string& name, const std::string& help, double value,
                               prometheus::MetricType type = prometheus::MetricType::Gauge) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

}  // namespace

std::optional<ProcessStats> ParseProcStat(const std::string& stat, double ticks, double page,
                                          double boot_time) {
  // "pid (comm) state ppid ...": comm is free text, so fields are counted after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || ticks <= 0) return std::nullopt;
  std::vector<std::string> f =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipWhitespace());
  // f[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24.
  if (f.size() < 22) return std::nullopt;
  double utime, stime, start, vsize, rss;
  if (!absl::SimpleAtod(f[11], &utime) || !absl::SimpleAtod(f[12], &stime) ||
      !absl::SimpleAtod(f[19], &start) || !absl::SimpleAtod(f[20], &vsize) ||
      !absl::SimpleAtod(f[21], &rss)) {
    return std::nullopt;
  }
  return ProcessStats{.cpu_seconds = (utime + stime) / ticks,
                      .resident_bytes = rss * page,
                      .virtual_bytes = vsize,
                      .start_time_seconds = boot_time + start / ticks};
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  static const double kTicks = static_cast<double>(sysconf(_SC_CLK_TCK));
  static const double kPage = static_cast<double>(sysconf(_SC_PAGESIZE));
  static const double kBootTime = BootTime();
  std::vector<prometheus::MetricFamily> out;
  if (auto s = ParseProcStat(ReadFile("/proc/self/stat"), kTicks, kPage, kBootTime)) {
    out.push_back(Gauge("process_cpu_seconds_total", "Total user and system CPU time spent in "
                        "seconds", s->cpu_seconds, prometheus::MetricType::Counter));
    out.push_back(Gauge("process_resident_memory_bytes", "Resident memory size in bytes",
                        s->resident_bytes));
    out.push_back(Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes",
                        s->virtual_bytes));
    out.push_back(Gauge("process_start_time_seconds",
                        "Start time of the process since unix epoch in seconds",
                        s->start_time_seconds));
  }
  if (const int fds = CountOpenFds(); fds >= 0) {
    out.push_back(Gauge("process_open_fds", "Number of open file descriptors", fds));
  }
  rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.push_back(Gauge("process_max_fds", "Maximum number of open file descriptors",
                        static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

std::shared_ptr<prometheus::Registry> BuildInfoRegistry() {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge()
      .Name("lazyattn_build_info")
      .Help("Always 1; the labels say which build this process runs")
      .Register(*registry)
      .Add({{"version", LAZYATTN_VERSION},
            {"git_sha", LAZYATTN_GIT_SHA},
            {"cuda", LAZYATTN_BUILD_CUDA}})
      .Set(1);
  return registry;
}

}  // namespace lazyattn
