#include "services/router/policy/outlier_detector.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace lazyattn::router {

std::string OutlierKey(std::string_view id, std::string_view address) {
  std::string key(address.empty() ? id : address);
  if (!address.empty()) key.append(" ").append(id);
  return key;
}

bool OutlierDetector::Record(const std::string& worker, ProbeResult result, absl::Time now,
                             std::string* why) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[worker];
  if (result == ProbeResult::kServing) {
    e.consecutive_failures = 0;
    if (e.ejected && now >= e.ejected_until) {
      e.ejected = false;
      e.admitted_since = now;
    }
    if (!e.ejected && e.ejection_streak > 0 && now - e.admitted_since >= options_.max_ejection) {
      e.ejection_streak = 0;  // stayed healthy long enough: the next ejection is short again
    }
    return false;
  }
  ++e.consecutive_failures;
  const bool eject =
      result == ProbeResult::kNotServing || e.consecutive_failures >= options_.consecutive_failures;
  if (!eject || (e.ejected && now < e.ejected_until)) return false;
  if (e.ejected) {
    // Still failing after its ejection time: out for the same period again, not longer (the
    // streak grows only with ejections separated by re-admissions).
    e.ejected_until = now + std::min(options_.max_ejection,
                                     options_.base_ejection * std::max(e.ejection_streak, 1));
    return false;
  }
  ++e.ejection_streak;
  ++ejections_;
  const absl::Duration length =
      std::min(options_.max_ejection, options_.base_ejection * e.ejection_streak);
  e.ejected = true;
  e.ejected_until = now + length;
  if (why != nullptr) {
    *why =
        absl::StrCat(result == ProbeResult::kNotServing
                         ? std::string("health NOT_SERVING")
                         : absl::StrCat(e.consecutive_failures, " failed health probes in a row"),
                     "; ejected for ", absl::FormatDuration(length), " (ejection ",
                     e.ejection_streak, " in a row)");
  }
  return true;
}

bool OutlierDetector::Admitted(const std::string& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  return it == entries_.end() || !it->second.ejected;
}

void OutlierDetector::Retain(const std::vector<std::string>& known, absl::Time now) {
  const absl::flat_hash_set<std::string> keep(known.begin(), known.end());
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<absl::Time, std::string>> departed;  // (ejected_until, worker)
  absl::erase_if(entries_, [&](const auto& kv) {
    if (keep.contains(kv.first)) return false;
    const Entry& e = kv.second;
    if (e.ejection_streak == 0 || now >= e.ejected_until + options_.max_ejection) return true;
    departed.emplace_back(e.ejected_until, kv.first);
    return false;
  });
  if (departed.size() > kMaxDepartedKept) {
    // The latest ejections stay; a flood of departures cannot grow the map without bound.
    std::nth_element(departed.begin(), departed.begin() + kMaxDepartedKept, departed.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = kMaxDepartedKept; i < departed.size(); ++i) entries_.erase(departed[i].second);
  }
}

int64_t OutlierDetector::ejections() const {
  absl::MutexLock lock(&mu_);
  return ejections_;
}

}  // namespace lazyattn::router
