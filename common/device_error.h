// Sticky device errors: a failure after which the device cannot be trusted again (CUDA's sticky
// errors such as cudaErrorIllegalAddress or cudaErrorLaunchFailure leave the context corrupt, and
// every later call in the process fails the same way; only a new process recovers). The code that
// sees the device error marks its Status with MarkStickyDeviceError (a payload, so the code and
// message stay as they were); the engine stops serving at once on a marked status instead of
// counting it as one failed step (services/worker/engine/engine_core.h).
#ifndef LAZYATTN_COMMON_DEVICE_ERROR_H_
#define LAZYATTN_COMMON_DEVICE_ERROR_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace lazyattn {

inline constexpr char kStickyDeviceErrorPayload[] = "type.lazyattn.dev/sticky-device-error";

// `status` (not OK) marked sticky.
inline absl::Status MarkStickyDeviceError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kStickyDeviceErrorPayload, absl::Cord("1"));
  return status;
}

inline bool IsStickyDeviceError(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kStickyDeviceErrorPayload).has_value();
}

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_DEVICE_ERROR_H_
