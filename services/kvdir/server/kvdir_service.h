// The KvDirectory gRPC service (callback API): Publish streams from workers (PublishReactor),
// Lookup and ListWorkers from routers, answered inline from the index.
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVICE_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "lazyattn/v1/kvdir.grpc.pb.h"
#include "services/kvdir/server/service_context.h"

namespace lazyattn::kvdir {

// Publish is registered raw (bytes in and out; PublishReactor parses and serializes), so that a
// message that does not parse ends its stream INVALID_ARGUMENT rather than as a half-close.
class KvdirService final
    : public v1::KvDirectory::WithRawCallbackMethod_Publish<
          v1::KvDirectory::WithCallbackMethod_Lookup<
              v1::KvDirectory::WithCallbackMethod_ListWorkers<v1::KvDirectory::Service>>> {
 public:
  explicit KvdirService(const ServiceContext& ctx) : ctx_(ctx) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Publish(
      grpc::CallbackServerContext* context) override;

  // INVALID_ARGUMENT naming `keys` when more than max_keys_per_lookup keys are asked for.
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;

  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;

 private:
  const ServiceContext ctx_;
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVICE_H_
