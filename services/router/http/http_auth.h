// API keys on the HTTP listener through the gRPC listener's own AuthMetadataProcessor
// (api_key_auth.h): the same keys, scopes, rate limits, reloads and metrics for both APIs. An
// HTTP request is presented to it as the gRPC method it stands for, with its Authorization header.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_AUTH_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_AUTH_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <string>
#include <string_view>

namespace lazyattn::router {

// `authorization`: the request's Authorization header ("" when absent); `method_path`: the gRPC
// method whose scope applies ("/lazyattn.v1.Inference/Complete"). OK with the key's name in
// `key_name` (empty when the processor names none); UNAUTHENTICATED, PERMISSION_DENIED or
// RESOURCE_EXHAUSTED (a key's rate limit) otherwise. A null processor admits everyone.
grpc::Status CheckApiKey(grpc::AuthMetadataProcessor* processor, std::string_view authorization,
                         std::string_view method_path, std::string* key_name);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_AUTH_H_
