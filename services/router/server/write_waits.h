// The time one call's writes have waited on its client, for ClientWriteWatch: one thread writes
// (a write starts, then completes; one at a time), another reads at any moment (the watch's
// sweeper), without a lock. Times are steady-clock nanoseconds passed in by the caller.
//
// Counted against a call's budget: each write's wait past its allowance (the time its bytes take
// at a minimum rate, given when it starts) and past the first kUncountedWaitNs after that (a
// busy router's own scheduling of the completion, which over a long answer would add up).
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_WRITE_WAITS_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_WRITE_WAITS_H_

#include <atomic>
#include <cstdint>

namespace lazyattn::router {

class WriteWaits {
 public:
  static constexpr int64_t kUncountedWaitNs = 5'000'000;  // 5 ms

  // A write started at `now_ns`; it waits on the client only once `allowance_ns` has passed.
  void Started(int64_t now_ns, int64_t allowance_ns);
  // The write in progress completed at `now_ns`; its wait joins the total. No-op without one.
  void Done(int64_t now_ns);

  struct Waits {
    int64_t current_ns;  // the write in progress has waited (0: none, or still in its allowance)
    int64_t counted_ns;  // against the budget, the write in progress included
  };
  // At `now_ns`. A stale read (a write completing meanwhile) counts too little, never twice.
  Waits At(int64_t now_ns) const;

 private:
  std::atomic<int64_t> waits_from_ns_{0};  // the write in progress waits from here; 0: none
  // Counted wait of the completed writes. Written by Done only (one write at a time).
  std::atomic<int64_t> counted_ns_{0};
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_WRITE_WAITS_H_
