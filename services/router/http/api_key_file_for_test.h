// For tests: RejectAll, a processor that refuses every key; and KeyFile, the router's own API key
// processor (api_key_auth.h) over a key file of two keys,
// "lzk_good" and "lzk_once", both with the `generate` scope, the second allowed one request
// (burst 1, then a token per 100 s). The file lives in the test's temporary folder while the
// object does.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_API_KEY_FILE_FOR_TEST_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_API_KEY_FILE_FOR_TEST_H_

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/document_key.h"
#include "services/router/server/api_key_auth.h"

namespace lazyattn::router::testing {

// Refuses every key, as the router's processor refuses a client without one.
class RejectAll final : public grpc::AuthMetadataProcessor {
 public:
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata&, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization: no API key");
  }
};

class KeyFile {
 public:
  KeyFile() : path_(absl::StrCat(::testing::TempDir(), "/http-keys-", getpid(), ".yaml")) {
    std::ofstream(path_) << "keys:\n"
                         << "  - name: good\n    sha256: " << Sha256Hex("lzk_good")
                         << "\n    scopes: [generate]\n"
                         << "  - name: once\n    sha256: " << Sha256Hex("lzk_once")
                         << "\n    scopes: [generate]\n"
                         << "    limits: {requests_per_second: 0.01, burst: 1}\n";
    auto created = ApiKeyAuthorizer::Create(path_, absl::Hours(1), registry_);
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) processor_ = std::move(*created);
  }
  ~KeyFile() { std::remove(path_.c_str()); }
  KeyFile(const KeyFile&) = delete;
  KeyFile& operator=(const KeyFile&) = delete;

  std::shared_ptr<grpc::AuthMetadataProcessor> processor() const { return processor_; }

 private:
  const std::string path_;
  prometheus::Registry registry_;
  std::shared_ptr<ApiKeyAuthorizer> processor_;
};

}  // namespace lazyattn::router::testing

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_API_KEY_FILE_FOR_TEST_H_
