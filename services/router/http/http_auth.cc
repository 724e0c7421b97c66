#include "services/router/http/http_auth.h"

#include <grpcpp/security/auth_context.h>

#include <utility>
#include <vector>

#include "services/router/server/api_key_auth.h"

namespace lazyattn::router {
namespace {

// AuthPropertyIterator's default constructor (the end of an empty property list) is protected.
class EmptyPropertyIterator : public grpc::AuthPropertyIterator {};

// The context a processor records its decision in; HTTP has no peer identity to offer.
class HttpAuthContext final : public grpc::AuthContext {
 public:
  bool IsPeerAuthenticated() const override { return false; }
  std::vector<grpc::string_ref> GetPeerIdentity() const override { return {}; }
  std::string GetPeerIdentityPropertyName() const override { return ""; }
  std::vector<grpc::string_ref> FindPropertyValues(const std::string& name) const override {
    std::vector<grpc::string_ref> values;
    for (const auto& [key, value] : properties_) {
      if (key == name) values.emplace_back(value);
    }
    return values;
  }
  grpc::AuthPropertyIterator begin() const override { return EmptyPropertyIterator(); }
  grpc::AuthPropertyIterator end() const override { return EmptyPropertyIterator(); }
  void AddProperty(const std::string& key, const grpc::string_ref& value) override {
    properties_.emplace_back(key, std::string(value.data(), value.size()));
  }
  bool SetPeerIdentityPropertyName(const std::string& /*name*/) override { return false; }

 private:
  std::vector<std::pair<std::string, std::string>> properties_;
};

}  // namespace

grpc::Status CheckApiKey(grpc::AuthMetadataProcessor* processor, std::string_view authorization,
                         std::string_view method_path, ApiCaller* caller) {
  *caller = ApiCaller();
  if (processor == nullptr) return grpc::Status::OK;
  grpc::AuthMetadataProcessor::InputMetadata metadata;
  metadata.emplace(grpc::string_ref(":path"),
                   grpc::string_ref(method_path.data(), method_path.size()));
  if (!authorization.empty()) {
    metadata.emplace(grpc::string_ref("authorization"),
                     grpc::string_ref(authorization.data(), authorization.size()));
  }
  HttpAuthContext context;
  grpc::AuthMetadataProcessor::OutputMetadata consumed, response;
  grpc::Status status = processor->Process(metadata, &context, &consumed, &response);
  if (!status.ok()) return status;
  const auto names = context.FindPropertyValues(kApiKeyNameProperty);
  if (!names.empty()) caller->key_name.assign(names.front().data(), names.front().size());
  const auto scopes = context.FindPropertyValues(kCacheNamespaceProperty);
  if (!scopes.empty()) caller->cache_namespace.assign(scopes.front().data(), scopes.front().size());
  return grpc::Status::OK;
}

}  // namespace lazyattn::router
