#include "services/worker/engine/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace lazyattn {
namespace {

std::string ReadSmall(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A cgroup v2 file holding one number ("max" or unreadable: -1).
int64_t CgroupNumber(const char* path) {
  int64_t v = -1;
  const std::string text(absl::StripAsciiWhitespace(ReadSmall(path)));
  return absl::SimpleAtoi(text, &v) && v >= 0 ? v : -1;
}

}  // namespace

int64_t MemAvailableBytes(std::string_view meminfo) {
  const absl::string_view text(meminfo.data(), meminfo.size());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    // "MemAvailable:   12345678 kB"
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (!absl::ConsumeSuffix(&line, " kB") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) || kib < 0 ||
        kib > (INT64_MAX >> 10)) {
      return -1;
    }
    return kib << 10;
  }
  return -1;
}

int64_t CgroupInactiveFileBytes(std::string_view memory_stat) {
  const absl::string_view text(memory_stat.data(), memory_stat.size());
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    int64_t bytes = 0;
    if (absl::ConsumePrefix(&line, "inactive_file ") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &bytes) && bytes >= 0) {
      return bytes;
    }
  }
  return 0;
}

int64_t AvailableHostMemoryBytes() {
  int64_t available = MemAvailableBytes(ReadSmall("/proc/meminfo"));
  const int64_t limit = CgroupNumber("/sys/fs/cgroup/memory.max");
  const int64_t used = CgroupNumber("/sys/fs/cgroup/memory.current");
  if (limit >= 0 && used >= 0) {
    // memory.current counts page cache the kernel reclaims before it fails an allocation (the
    // model file just read): its inactive part is room, as the kubelet's working set counts it.
    const int64_t cache = CgroupInactiveFileBytes(ReadSmall("/sys/fs/cgroup/memory.stat"));
    const int64_t room = std::max<int64_t>(0, limit - std::max<int64_t>(0, used - cache));
    available = available < 0 ? room : std::min(available, room);
  }
  return available;
}

}  // namespace lazyattn
