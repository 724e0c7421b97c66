// API keys on the HTTP listener through the gRPC listener's own AuthMetadataProcessor
// (api_key_auth.h): the same keys, scopes, rate limits, reloads and metrics for both APIs. An
// HTTP request is presented to it as the gRPC method it stands for, with its Authorization header.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_AUTH_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_AUTH_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <string>
#include <string_view>

namespace lazyattn::router {

// Who an admitted request came from.
struct ApiCaller {
  std::string key_name;         // empty without API keys
  std::string cache_namespace;  // the key's (api_key_auth.h); empty without API keys
};

// `authorization`: the request's Authorization header ("" when absent); `method_path`: the gRPC
// method whose scope applies ("/lazyattn.v1.Inference/Complete"). OK with the key's name and
// cache namespace in `caller` (empty when the processor names none); UNAUTHENTICATED,
// PERMISSION_DENIED or RESOURCE_EXHAUSTED (a key's rate limit) otherwise. A null processor admits
// everyone.
grpc::Status CheckApiKey(grpc::AuthMetadataProcessor* processor, std::string_view authorization,
                         std::string_view method_path, ApiCaller* caller);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_AUTH_H_
