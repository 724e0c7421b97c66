#include "services/kvdir/server/publish_streams.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace lazyattn::kvdir {

absl::StatusOr<uint64_t> PublishStreams::Open(const std::string& certificate_id,
                                              const std::string& peer_host, absl::Time now,
                                              std::function<void()> cancel,
                                              bool* per_certificate) {
  absl::MutexLock lock(&mu_);
  if (per_certificate != nullptr) *per_certificate = false;
  if (static_cast<int64_t>(streams_.size()) >= limits_.max_streams) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kvdir holds ", streams_.size(),
                     " Publish streams, its limit (limits.max_publish_streams)"));
  }
  if (!certificate_id.empty()) {
    auto it = per_certificate_.find(certificate_id);
    if (it != per_certificate_.end() && it->second >= limits_.max_per_certificate) {
      if (per_certificate != nullptr) *per_certificate = true;
      return absl::ResourceExhaustedError(absl::StrCat(
          "the certificate of worker ", certificate_id, " already holds ", it->second,
          " Publish streams, its limit (limits.max_streams_per_certificate); a worker needs one"));
    }
    ++per_certificate_[certificate_id];
  }
  const uint64_t id = next_id_++;
  streams_.emplace(id, Stream{.certificate_id = certificate_id,
                              .peer_host = peer_host,
                              .opened = now,
                              .cancel = std::move(cancel)});
  return id;
}

void PublishStreams::SaidHello(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (auto it = streams_.find(id); it != streams_.end()) it->second.said_hello = true;
}

void PublishStreams::Close(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  if (!it->second.certificate_id.empty()) {
    auto count = per_certificate_.find(it->second.certificate_id);
    if (count != per_certificate_.end() && --count->second <= 0) per_certificate_.erase(count);
  }
  streams_.erase(it);
}

std::vector<SilentStream> PublishStreams::CancelSilent(absl::Time now) {
  std::vector<SilentStream> out;
  absl::MutexLock lock(&mu_);
  for (auto& [id, s] : streams_) {
    if (s.said_hello || s.cancelled || now - s.opened < limits_.hello_timeout) continue;
    s.cancelled = true;
    if (s.cancel) s.cancel();
    out.push_back({.certificate_id = s.certificate_id,
                   .peer_host = s.peer_host,
                   .open_for = now - s.opened});
  }
  return out;
}

int64_t PublishStreams::open_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(streams_.size());
}

}  // namespace lazyattn::kvdir
