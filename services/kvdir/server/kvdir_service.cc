#include "services/kvdir/server/kvdir_service.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/certificate_names.h"
#include "common/grpc_util.h"
#include "common/monotonic_time.h"
#include "services/kvdir/server/proto_convert.h"
#include "services/kvdir/server/publish_reactor.h"

namespace lazyattn::kvdir {

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KvdirService::Publish(
    grpc::CallbackServerContext* context) {
  // RoleAuthorizer admitted only worker certificates here and recorded the name; without an
  // authorizer (insecure) there is no identity and the stream is not bound.
  PublishReactor::Caller caller;
  if (auto auth = context->auth_context()) {
    if (auto peer = AuthorizedPeerOf(*auth)) {
      caller.worker_id = peer->name;
      caller.certificate_names = PeerCertificateNames(*auth);
    }
    caller.certificate_serial = PeerCertificateSerial(*auth);
  }
  return new PublishReactor(context, ctx_, std::move(caller));
}

grpc::ServerUnaryReactor* KvdirService::Lookup(grpc::CallbackServerContext* context,
                                               const v1::LookupRequest* request,
                                               v1::LookupResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (request->keys_size() > ctx_.max_keys_per_lookup) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("keys: ", request->keys_size(), " keys, at most ",
                                              ctx_.max_keys_per_lookup, " per lookup")));
    return reactor;
  }
  absl::StatusOr<ResidencyRule> rule = LookupRuleFromProto(*request);
  if (!rule.ok()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 std::string(rule.status().message())));
    return reactor;
  }
  const absl::Time start = MonotonicNow();
  std::vector<DocumentKey> keys;
  keys.reserve(request->keys_size());
  for (const v1::DocKey& k : request->keys()) keys.push_back(KeyFromProto(k));
  std::vector<WorkerResidency> workers =
      ctx_.index->Lookup(keys, *rule, request->offsets(), start);
  response->mutable_workers()->Reserve(static_cast<int>(workers.size()));
  for (WorkerResidency& w : workers) ResidencyToProto(std::move(w), response->add_workers());
  ctx_.metrics->ObserveLookup(MonotonicNow() - start);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* KvdirService::ListWorkers(grpc::CallbackServerContext* context,
                                                    const v1::ListWorkersRequest* /*request*/,
                                                    v1::ListWorkersResponse* response) {
  std::vector<WorkerResidency> workers = ctx_.index->Lookup({}, MonotonicNow());
  response->mutable_workers()->Reserve(static_cast<int>(workers.size()));
  for (WorkerResidency& w : workers) ResidencyToProto(std::move(w), response->add_workers());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace lazyattn::kvdir
