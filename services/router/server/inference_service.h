// The public Inference service (callback API). Generate streams through a ServerWriteReactor,
// Complete buffers through a unary reactor (both are ForwardingCalls); Prefetch warms documents on
// the routed worker(s); GetModelInfo answers from the workers' last reported status.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_INFERENCE_SERVICE_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_INFERENCE_SERVICE_H_

#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/key_limits.h"
#include "services/router/server/router_context.h"

namespace lazyattn::router {

class InferenceService final : public lazyattn::v1::Inference::CallbackService {
 public:
  // `key_limiter` (may be null: no API keys) caps each key's Generate/Complete calls in flight.
  explicit InferenceService(RouterContext* router, KeyLimiter* key_limiter = nullptr)
      : router_(router), key_limiter_(key_limiter) {}

  grpc::ServerWriteReactor<lazyattn::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const lazyattn::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Complete(grpc::CallbackServerContext* context,
                                     const lazyattn::v1::GenerateRequest* request,
                                     lazyattn::v1::CompleteResponse* response) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* context,
                                     const lazyattn::v1::PrefetchRequest* request,
                                     lazyattn::v1::PrefetchResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const lazyattn::v1::GetModelInfoRequest* request,
                                         lazyattn::v1::ModelInfo* response) override;

 private:
  RouterContext* const router_;
  KeyLimiter* const key_limiter_;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_INFERENCE_SERVICE_H_
