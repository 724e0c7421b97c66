#include "common/grpc_util.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

namespace lazyattn {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("tls.", what, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void KeepCallbackQueueAlive() {
  // gRPC 1.51 on POSIX serves the callback API of every channel from one process-global
  // completion queue, counted by the channels that used it: when the last of them is destroyed
  // gRPC shuts the queue down and deletes it, and a channel made meanwhile races that teardown
  // (an abort in grpc_cq_internal_unref, "assertion failed: prior > 0"; seen in 1 of ~200 test
  // processes that create and destroy routers, and possible in a router that loses every worker).
  // One channel that made a callback call and is never destroyed keeps the count above zero.
  static const bool kept = [] {
    auto channel = grpc::CreateChannel("127.0.0.1:9", grpc::InsecureChannelCredentials());
    auto* stub = new grpc::GenericStub(channel);  // all leaked on purpose: they must outlive
    auto* context = new grpc::ClientContext();    // every other channel of the process
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
    grpc::Slice empty(std::string{});
    auto* request = new grpc::ByteBuffer(&empty, 1);  // an empty message, still a valid one
    auto* response = new grpc::ByteBuffer();
    stub->UnaryCall(context, "/lazyattn.internal.Anchor/Keep", grpc::StubOptions(), request,
                    response, [](grpc::Status) {});
    return true;
  }();
  (void)kept;
}

absl::StatusOr<BuiltServer> StartGrpcServer(const ServerOptions& options,
                                            const std::vector<grpc::Service*>& services) {
  KeepCallbackQueueAlive();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls.cert_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    auto cert = ReadPem(options.tls.cert_file, "cert_file");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(options.tls.key_file, "key_file");
    if (!key.ok()) return key.status();
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options.tls.ca_file.empty()) {
      auto ca = ReadPem(options.tls.ca_file, "ca_file");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  }
  BuiltServer built;
  builder.AddListeningPort(options.listen_address, creds, &built.port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  built.server = builder.BuildAndStart();
  if (built.server == nullptr || built.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address));
  }
  if (auto* health = built.server->GetHealthCheckService()) health->SetServingStatus(true);
  return built;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const TlsOptions& tls,
                                                           int max_message_bytes) {
  KeepCallbackQueueAlive();
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!tls.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    auto ca = ReadPem(tls.ca_file, "ca_file");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!tls.cert_file.empty()) {
      auto cert = ReadPem(tls.cert_file, "cert_file");
      if (!cert.ok()) return cert.status();
      auto key = ReadPem(tls.key_file, "key_file");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  return grpc::CreateCustomChannel(address, creds, args);
}

}  // namespace lazyattn
