#include "services/router/server/worker_registry.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/certificate_names.h"
#include "common/log.h"

namespace lazyattn::router {
namespace {

// A worker seen with another model than before (or with one for the first time) starts the
// clock its model's age is measured from.
void UpdateModelSince(WorkerInfo& info, const lazyattn::v1::WorkerStatus& next, absl::Time now) {
  if (!info.reported || ModelKeyOf(info.status.model()) != ModelKeyOf(next.model())) {
    info.model_since = now;
  }
}

// Why the router does not dial a worker the directory lists at `address`; "" when it does.
std::string_view ListedAddressRefusal(const std::string& address, bool directory_on_this_host) {
  if (!DialsOverTheNetwork(address)) return "it does not dial over the network";
  if (!directory_on_this_host && DialsThisHost(address)) {
    return "it is this router's own host, and the router reaches kvdir over the network "
           "(kvdir.loopback_workers: dial, for a one-host cluster dialling kvdir by another name)";
  }
  return "";
}

}  // namespace

bool DialsThisHost(absl::string_view address) {
  const std::optional<std::string> host = DialedHost(address);
  return host.has_value() && IsLocalHost(*host);
}

WorkerRegistry::WorkerRegistry(std::vector<std::string> static_addresses, TlsOptions client_tls,
                               int max_message_bytes, absl::Duration forget_after,
                               bool directory_on_this_host)
    : static_addresses_(std::move(static_addresses)),
      client_tls_(std::move(client_tls)),
      max_message_bytes_(max_message_bytes),
      forget_after_(forget_after),
      directory_on_this_host_(directory_on_this_host) {
  absl::MutexLock lock(&mu_);
  for (const std::string& address : static_addresses_) {
    Entry& e = by_address_[address];
    e.is_static = true;
    e.info.id = address;
    e.info.address = address;
  }
}

void WorkerRegistry::ObserveDirectory(
    const google::protobuf::RepeatedPtrField<lazyattn::v1::WorkerResidency>& workers,
    absl::Time now) {
  absl::MutexLock lock(&mu_);
  const absl::Time outage_start = std::max(unanswered_since_, last_answer_);
  if (now > outage_start && last_answer_ != absl::InfinitePast()) {
    // The directory did not answer from outage_start on: that time was not "not listed".
    const absl::Duration outage = now - outage_start;
    for (auto& [address, e] : by_address_) {
      if (e.from_directory) e.last_listed = std::min(now, e.last_listed + outage);
    }
  }
  unanswered_since_ = absl::InfiniteFuture();
  last_answer_ = std::max(last_answer_, now);
  // The address each listed worker id is at now: kvdir lists an id at one address only.
  absl::flat_hash_map<std::string, std::string> listed_at;
  for (const auto& w : workers) {
    const auto& status = w.worker();
    if (status.address().empty()) continue;
    const std::string_view refusal =
        ListedAddressRefusal(status.address(), directory_on_this_host_);
    if (!refusal.empty()) {
      if (now - refusal_logged_ >= absl::Minutes(1)) {
        refusal_logged_ = now;
        LogWarning("router")
            .Str("worker", status.worker_id())
            .Str("address", status.address())
            .Str("why", refusal)
            .Msg(
                "kvdir lists a worker at an address this router does not dial (logged once a "
                "minute)");
      }
      // Where the id is listed now, so an address it had before is forgotten at once.
      if (!status.worker_id().empty()) listed_at[status.worker_id()] = status.address();
      continue;
    }
    if (!status.worker_id().empty()) listed_at[status.worker_id()] = status.address();
    Entry& e = by_address_[status.address()];
    e.from_directory = true;
    e.last_listed = now;
    e.info.address = status.address();
    e.info.id = status.worker_id().empty() ? status.address() : status.worker_id();
    UpdateModelSince(e.info, status, now);
    e.info.status = status;
    // Kept and copied into every routing decision's snapshot: nothing this build cannot read.
    e.info.status.DiscardUnknownFields();
    e.info.reported = true;
  }
  for (auto it = by_address_.begin(); it != by_address_.end();) {
    Entry& e = it->second;
    // A worker listed at a new address (restarted with the same worker id on a new pod IP):
    // its old address is dead, and, as breakers go by id, kept for forget_after its failures
    // would shut the live address out too.
    const auto moved = listed_at.find(e.info.id);
    const bool moved_away = moved != listed_at.end() && moved->second != it->first;
    if (e.from_directory && (moved_away || e.last_listed + forget_after_ <= now)) {
      if (e.is_static) {
        e.from_directory = false;  // back to what the Status polls say
        ++it;
      } else {
        dialled_.erase(it->first);
        by_address_.erase(it++);
      }
    } else {
      ++it;
    }
  }
}

void WorkerRegistry::ObserveDirectoryFailure(absl::Time sent_at) {
  absl::MutexLock lock(&mu_);
  unanswered_since_ = std::min(unanswered_since_, sent_at);
}

void WorkerRegistry::ObserveStatic(const std::string& address,
                                   const lazyattn::v1::WorkerStatus* status, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = by_address_.find(address);
  if (it == by_address_.end()) return;
  Entry& e = it->second;
  if (e.from_directory) return;  // the directory's view is at least as fresh
  if (status == nullptr) {
    if (e.info.reported && now - e.last_polled < forget_after_) return;
    e.info.reported = false;
    return;
  }
  e.last_polled = now;
  UpdateModelSince(e.info, *status, now);
  e.info.status = *status;
  e.info.status.DiscardUnknownFields();  // as in ObserveDirectory
  e.info.id = status->worker_id().empty() ? address : status->worker_id();
  e.info.reported = true;
}

std::vector<WorkerInfo> WorkerRegistry::Snapshot() const {
  std::vector<WorkerInfo> out;
  {
    absl::MutexLock lock(&mu_);
    out.reserve(by_address_.size());
    for (const auto& [address, e] : by_address_) out.push_back(e.info);
  }
  std::sort(out.begin(), out.end(), [](const WorkerInfo& a, const WorkerInfo& b) {
    return a.id != b.id ? a.id < b.id : a.address < b.address;
  });
  return out;
}

std::vector<ModelGroup> WorkerRegistry::Models() const {
  std::vector<ModelGroup> groups;
  absl::flat_hash_map<ModelKey, size_t> index;
  for (const WorkerInfo& w : Snapshot()) {  // by id: a group's info is its first worker's, limits
                                            // aside
    if (!w.reported || w.status.model().model_fingerprint().empty()) continue;
    ModelKey key = ModelKeyOf(w.status.model());
    auto [it, inserted] = index.try_emplace(key, groups.size());
    if (inserted) {
      ModelGroup& g = groups.emplace_back();
      g.key = std::move(key);
      g.info = w.status.model();
      g.since = w.model_since;
    }
    ModelGroup& g = groups[it->second];
    if (!inserted) {
      // Workers of one model may be configured apart: the group takes what all of them take
      // (docs/router.md, GetModelInfo). With the first worker's, a request within it and past
      // another's was admitted, then refused by that worker, and not failed over.
      const auto smaller = [](auto have, auto other) {
        return other > 0 && (have <= 0 || other < have) ? other : have;
      };
      g.info.set_max_documents(smaller(g.info.max_documents(), w.status.model().max_documents()));
      g.info.set_max_context_tokens(
          smaller(g.info.max_context_tokens(), w.status.model().max_context_tokens()));
    }
    ++g.workers;
    g.since = std::min(g.since, w.model_since);
  }
  AssignModelIds(groups);
  return groups;
}

absl::StatusOr<std::optional<ModelGroup>> WorkerRegistry::ResolveModel(
    std::string_view requested) const {
  const std::vector<ModelGroup> groups = Models();
  absl::StatusOr<const ModelGroup*> group = lazyattn::router::ResolveModel(groups, requested);
  if (!group.ok()) return group.status();
  if (*group == nullptr) return std::nullopt;
  return **group;
}

std::optional<lazyattn::v1::ModelInfo> WorkerRegistry::Model() const {
  std::vector<ModelGroup> groups = Models();
  if (groups.size() != 1) return std::nullopt;
  return std::move(groups.front().info);
}

int WorkerRegistry::LiveCount() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [address, e] : by_address_) n += e.info.reported ? 1 : 0;
  return n;
}

std::string WorkerRegistry::ExpectedWorkerNameLocked(const std::string& address,
                                                     const std::string& worker_id) const {
  auto it = by_address_.find(address);
  if (it != by_address_.end() && !it->second.from_directory) return "";  // static
  const std::string& id =
      worker_id.empty() && it != by_address_.end() ? it->second.info.id : worker_id;
  return id == address ? "" : id;  // an id-less listing: the address stands in
}

absl::StatusOr<std::shared_ptr<lazyattn::v1::Worker::Stub>> WorkerRegistry::Stub(
    const std::string& address, const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  const std::string name = ExpectedWorkerNameLocked(address, worker_id);
  auto it = dialled_.find(address);
  if (it != dialled_.end() && it->second.worker_name == name) return it->second.stub;
  TlsOptions tls = client_tls_;
  tls.server_identity = PeerIdentity{std::string(kRoleWorker), name};
  auto channel = MakeChannel(address, tls, max_message_bytes_);
  if (!channel.ok()) return channel.status();
  std::shared_ptr<lazyattn::v1::Worker::Stub> stub = lazyattn::v1::Worker::NewStub(*channel);
  // Kept only for a known address, and only for the id listed there now (else nothing would
  // erase it, or it would replace the channel of the worker listed there: header).
  if (by_address_.contains(address) && name == ExpectedWorkerNameLocked(address, "")) {
    dialled_[address] = Dialled{*channel, stub, name};
  }
  return stub;
}

size_t WorkerRegistry::kept_channels() const {
  absl::MutexLock lock(&mu_);
  return dialled_.size();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> WorkerRegistry::Channel(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    // Not made only to be dropped: Stub keeps no channel for an address it does not know.
    if (!by_address_.contains(address)) {
      return absl::UnavailableError(absl::StrCat(address, ": no longer a known worker"));
    }
  }
  // Through Stub: it dials again when the id listed at the address changed.
  auto stub = Stub(address);
  if (!stub.ok()) return stub.status();
  absl::MutexLock lock(&mu_);
  auto it = dialled_.find(address);
  if (it == dialled_.end()) {
    return absl::UnavailableError(absl::StrCat(address, ": no longer a known worker"));
  }
  return it->second.channel;
}

void WorkerRegistry::AddInflight(const WorkerInfo& worker, int delta) {
  absl::MutexLock lock(&mu_);
  const auto key = std::make_pair(worker.id, worker.address);
  int64_t& n = inflight_[key];
  n += delta;
  if (n <= 0) inflight_.erase(key);
}

int64_t WorkerRegistry::Inflight(const WorkerInfo& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(std::make_pair(worker.id, worker.address));
  return it == inflight_.end() ? 0 : it->second;
}

}  // namespace lazyattn::router
