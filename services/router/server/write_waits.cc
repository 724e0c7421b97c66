#include "services/router/server/write_waits.h"

#include <algorithm>

namespace lazyattn::router {

void WriteWaits::Started(int64_t now_ns, int64_t allowance_ns) {
  waits_from_ns_.store(std::max<int64_t>(1, now_ns + std::max<int64_t>(0, allowance_ns)),
                       std::memory_order_relaxed);
}

void WriteWaits::Done(int64_t now_ns) {
  const int64_t from = waits_from_ns_.load(std::memory_order_relaxed);
  if (from == 0) return;  // no write was started: nothing waited
  const int64_t counted = std::max<int64_t>(0, now_ns - from - kUncountedWaitNs);
  // The write ends before its wait joins the total, and the total is published with release
  // (At loads it with acquire first): a reader that sees the new total sees the write ended, so
  // it never counts this wait twice.
  waits_from_ns_.store(0, std::memory_order_relaxed);
  counted_ns_.store(counted_ns_.load(std::memory_order_relaxed) + counted,
                    std::memory_order_release);
}

WriteWaits::Waits WriteWaits::At(int64_t now_ns) const {
  const int64_t done = counted_ns_.load(std::memory_order_acquire);
  const int64_t from = waits_from_ns_.load(std::memory_order_relaxed);
  // 0 while a write's allowance lasts, or for a write started after `now_ns`.
  const int64_t current = from == 0 ? 0 : std::max<int64_t>(0, now_ns - from);
  return {.current_ns = current,
          .counted_ns = done + std::max<int64_t>(0, current - kUncountedWaitNs)};
}

}  // namespace lazyattn::router
