#include "common/auth.h"

#include <gtest/gtest.h>

namespace lazyattn {
namespace {

TEST(ParseIdentityUri, AcceptsEachRoleWithAWellFormedName) {
  auto w = ParseIdentityUri("lazyattn://worker/worker-0");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->role, "worker");
  EXPECT_EQ(w->name, "worker-0");
  EXPECT_EQ(ParseIdentityUri("lazyattn://router/r.1")->role, "router");
  EXPECT_EQ(ParseIdentityUri("lazyattn://client/app_1")->role, "client");
  EXPECT_EQ(ParseIdentityUri("lazyattn://admin/ops")->name, "ops");
}

TEST(ParseIdentityUri, RefusesOtherSchemesRolesAndNames) {
  EXPECT_FALSE(ParseIdentityUri("spiffe://worker/worker-0"));
  EXPECT_FALSE(ParseIdentityUri("lazyattn://root/x"));
  EXPECT_FALSE(ParseIdentityUri("lazyattn://worker/"));
  EXPECT_FALSE(ParseIdentityUri("lazyattn://worker"));
  EXPECT_FALSE(ParseIdentityUri("lazyattn://worker/a/b"));
  EXPECT_FALSE(ParseIdentityUri("lazyattn://worker/a b"));
  EXPECT_FALSE(ParseIdentityUri("lazyattn://worker/" + std::string(129, 'a')));
  EXPECT_TRUE(ParseIdentityUri("lazyattn://worker/" + std::string(128, 'a')));
}

TEST(IsOpenMethod, OnlyHealthAndReflection) {
  EXPECT_TRUE(IsOpenMethod("/grpc.health.v1.Health/Check"));
  EXPECT_TRUE(IsOpenMethod("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"));
  EXPECT_FALSE(IsOpenMethod("/lazyattn.v1.Worker/Generate"));
  EXPECT_FALSE(IsOpenMethod(""));
}

TEST(CheckTransportSecurity, NeedsExactlyOneOfTlsAndInsecure) {
  EXPECT_TRUE(CheckTransportSecurity("p", "c.yaml", true, false).ok());
  EXPECT_TRUE(CheckTransportSecurity("p", "c.yaml", false, true).ok());
  const absl::Status neither = CheckTransportSecurity("p", "c.yaml", false, false);
  EXPECT_EQ(neither.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(neither.message().find("insecure: true"), std::string::npos);
  EXPECT_EQ(CheckTransportSecurity("p", "c.yaml", true, true).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckPeerCallSecurity, CallsGoOverTlsUnlessInsecure) {
  EXPECT_TRUE(CheckPeerCallSecurity("c.yaml", "client_tls.ca_file", true, true, false).ok());
  EXPECT_TRUE(CheckPeerCallSecurity("c.yaml", "client_tls.ca_file", true, false, true).ok());
  EXPECT_TRUE(CheckPeerCallSecurity("c.yaml", "kvdir.tls.ca_file", false, false, false).ok());
  const absl::Status plaintext =
      CheckPeerCallSecurity("c.yaml", "client_tls.ca_file", true, false, false);
  EXPECT_EQ(plaintext.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plaintext.message().rfind("c.yaml: client_tls.ca_file: not configured", 0), 0u)
      << plaintext;
}

}  // namespace
}  // namespace lazyattn
