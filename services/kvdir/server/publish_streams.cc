#include "services/kvdir/server/publish_streams.h"

#include <algorithm>
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
                              .cancel = std::move(cancel),
                              .budget = FullBudget(now)});
  if (!certificate_id.empty()) budgets_.try_emplace(certificate_id, FullBudget(now));
  return id;
}

double PublishStreams::Burst() const {
  return PublishStreamLimits::kBurstSeconds * static_cast<double>(limits_.entries_per_s);
}

PublishStreams::Budget PublishStreams::FullBudget(absl::Time now) const {
  return Budget{.entries = Burst(), .refilled = now};
}

void PublishStreams::Refill(Budget& budget, absl::Time now) const {
  if (now <= budget.refilled) return;
  budget.entries =
      std::min(Burst(), budget.entries + static_cast<double>(limits_.entries_per_s) *
                                             absl::ToDoubleSeconds(now - budget.refilled));
  budget.refilled = now;
}

absl::Status PublishStreams::Charge(uint64_t id, int64_t entries, absl::Time now) {
  if (limits_.entries_per_s <= 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return absl::OkStatus();
  const std::string& certificate = it->second.certificate_id;
  Budget& budget = certificate.empty() ? it->second.budget : budgets_[certificate];
  Refill(budget, now);
  const double cost = static_cast<double>(std::max<int64_t>(entries, 1));
  if (budget.entries < cost) {
    return absl::ResourceExhaustedError(
        absl::StrCat(certificate.empty() ? "this stream"
                                         : absl::StrCat("the certificate of worker ", certificate),
                     " went past limits.max_publish_entries_per_s (", limits_.entries_per_s,
                     " directory entries stored, removed or replaced a second, in bursts of ",
                     static_cast<int64_t>(PublishStreamLimits::kBurstSeconds), " seconds' worth)"));
  }
  budget.entries -= cost;
  return absl::OkStatus();
}

void PublishStreams::SaidHello(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (auto it = streams_.find(id); it != streams_.end()) it->second.said_hello = true;
}

bool PublishStreams::CancelledSilent(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(id);
  return it != streams_.end() && it->second.cancelled;
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
  absl::erase_if(budgets_, [&](auto& entry) {
    if (per_certificate_.contains(entry.first)) return false;
    Refill(entry.second, now);
    return entry.second.entries >= Burst();
  });
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
