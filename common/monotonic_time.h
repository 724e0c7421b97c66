// A monotonic clock in absl::Time form, for deadlines and leases that must not move when the
// wall clock is stepped (NTP, an operator's `date -s`, a VM restored from a snapshot).
//
// Its values are the time since an arbitrary fixed point (the host's boot) dressed as absl::Time,
// so code written against absl::Time (and tested with a fake clock) runs on it unchanged. They
// are not dates: compare them with each other only, and convert one with WallTimeOf before it
// leaves the process.
//
//   const absl::Time now = MonotonicNow();
//   if (now >= lease_expiry) Expire();
//   response.set_last_seen_unix_ms(absl::ToUnixMillis(WallTimeOf(last_seen)));
#ifndef LAZYATTN_COMMON_MONOTONIC_TIME_H_
#define LAZYATTN_COMMON_MONOTONIC_TIME_H_

#include <chrono>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace lazyattn {

inline absl::Time MonotonicNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

// `monotonic` (a MonotonicNow() value) as the steady clock's time point, for waits with a
// deadline: std::condition_variable::wait_until(lock, ToSteadyTimePoint(deadline), ...).
inline std::chrono::steady_clock::time_point ToSteadyTimePoint(absl::Time monotonic) {
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          absl::ToChronoNanoseconds(monotonic - absl::UnixEpoch())));
}

// The wall-clock time at which MonotonicNow() read `monotonic` (as the wall clock reads now).
inline absl::Time WallTimeOf(absl::Time monotonic) {
  return absl::Now() - (MonotonicNow() - monotonic);
}

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_MONOTONIC_TIME_H_
