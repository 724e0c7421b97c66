// What a Generate or Complete request must pass before the router forwards it, one code path for
// both fronts (the gRPC Inference service and the HTTP API), so their refusals cannot drift:
//
//   1. API key and scope, and the key's request rate: the router's ApiKeyAuthorizer
//      (api_key_auth.h). gRPC runs it as the server's AuthMetadataProcessor before the handler;
//      the HTTP listener runs the same object on the Authorization header before reading the
//      body (services/router/http/http_auth.h). UNAUTHENTICATED, PERMISSION_DENIED,
//      RESOURCE_EXHAUSTED naming the key.
//   2. Admit() below, in this order:
//      a. the request itself (common/request_validator.h) against the router's limits and the
//         served model's vocabulary: INVALID_ARGUMENT naming the field;
//      b. the documents the served model's workers take (ModelInfo.max_documents, which
//         GetModelInfo reports to clients): INVALID_ARGUMENT naming `documents`;
//      c. the key's in-flight cap (KeyLimiter): RESOURCE_EXHAUSTED naming the key;
//      d. the router's in-flight limit (limits.max_inflight_requests): RESOURCE_EXHAUSTED.
//   The model a request names is resolved when the call starts (ForwardingCall::Begin), the same
//   for both fronts.
//
// Every refusal of Admit() is counted in the router's metrics (validation failures by field, the
// request by its status), so a front only sends it back.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_ADMISSION_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_ADMISSION_H_

#include <grpcpp/support/status.h>

#include <span>
#include <string>

#include "lazyattn/v1/inference.pb.h"
#include "services/router/server/key_limits.h"
#include "services/router/server/router_context.h"

namespace lazyattn::router {

// An admitted request's places under its key's in-flight cap and the router's in-flight limit,
// both given back when the ticket is destroyed. Movable; a default ticket holds nothing.
class AdmissionTicket {
 public:
  AdmissionTicket() = default;
  AdmissionTicket(AdmissionTicket&& other) noexcept;
  AdmissionTicket& operator=(AdmissionTicket&& other) noexcept;
  AdmissionTicket(const AdmissionTicket&) = delete;
  AdmissionTicket& operator=(const AdmissionTicket&) = delete;
  ~AdmissionTicket();

  bool admitted() const { return router_ != nullptr; }

 private:
  friend grpc::Status AdmitRequest(RouterContext*, KeyLimiter*, const std::string&,
                                   const lazyattn::v1::GenerateRequest&,
                                   std::span<AdmissionTicket>);
  void Reset();

  RouterContext* router_ = nullptr;  // set: holds one of the router's in-flight places
  KeySlot key_slot_;
};

// Steps 2a-2d above for `request`, sent with the API key named `key_name` ("" without API keys;
// `key_limiter` null without them). OK with `ticket` holding the places; else the refusal,
// already counted, and `ticket` untouched. `router` must outlive the ticket.
grpc::Status AdmitRequest(RouterContext* router, KeyLimiter* key_limiter,
                          const std::string& key_name, const lazyattn::v1::GenerateRequest& request,
                          AdmissionTicket* ticket);

// The same for `request` run as tickets.size() >= 1 calls at once (the choices of an HTTP
// request with OpenAI's `n`, services/router/http/choice_calls.h): validated once, then every
// call's places taken together or none, so a refused request never holds some, even for the
// moment that would refuse a concurrent request. OK with every ticket holding its places; else
// the refusal, counted once, and the tickets untouched.
grpc::Status AdmitRequest(RouterContext* router, KeyLimiter* key_limiter,
                          const std::string& key_name, const lazyattn::v1::GenerateRequest& request,
                          std::span<AdmissionTicket> tickets);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ADMISSION_H_
