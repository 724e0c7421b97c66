// Malformed request messages get INVALID_ARGUMENT naming `request`, on every server.
//
// gRPC's callback API answers a request whose bytes do not parse as the method's message with
// UNIMPLEMENTED and no message (grpcpp's server_callback_handlers.h: a failed deserialization
// leaves no reactor, and it finishes the call as unimplemented), which tells a client that the
// method does not exist. This interceptor notices the failed parse (the received message is
// null after POST_RECV_MESSAGE) and rewrites that status, and only that one: UNIMPLEMENTED with an
// empty message, which the servers' own code never sends. StartGrpcServer installs it.
#ifndef LAZYATTN_COMMON_MALFORMED_REQUEST_H_
#define LAZYATTN_COMMON_MALFORMED_REQUEST_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

namespace lazyattn {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeMalformedRequestInterceptorFactory();

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_MALFORMED_REQUEST_H_
