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

int64_t AvailableHostMemoryBytes() {
  int64_t available = MemAvailableBytes(ReadSmall("/proc/meminfo"));
  const int64_t limit = CgroupNumber("/sys/fs/cgroup/memory.max");
  const int64_t used = CgroupNumber("/sys/fs/cgroup/memory.current");
  if (limit >= 0 && used >= 0) {
    const int64_t room = std::max<int64_t>(0, limit - used);
    available = available < 0 ? room : std::min(available, room);
  }
  return available;
}

}  // namespace lazyattn
