#include "services/router/server/request_validator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateRequest;
using lazyattn::v1::PrefetchRequest;
using ::testing::HasSubstr;

GenerateRequest Valid() {
  GenerateRequest r;
  r.add_documents()->set_text("a document");
  r.add_documents()->mutable_tokens()->add_ids(5);
  r.set_question("why?");
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_p(0.9f);
  r.mutable_sampling()->set_max_tokens(64);
  r.mutable_sampling()->add_stop("\n\n");
  r.set_cache_mode(lazyattn::v1::CACHE_MODE_LAZY);
  return r;
}

std::string Error(const GenerateRequest& r, int64_t vocab = 1000) {
  RequestLimits limits;
  limits.max_documents = 3;
  limits.max_document_bytes = 16;
  limits.max_document_tokens = 4;
  limits.max_stop_strings = 2;
  limits.max_stop_bytes = 4;
  limits.max_stop_token_ids = 2;
  limits.max_system_bytes = 8;
  limits.max_question_bytes = 8;
  limits.max_tokens = 100;
  absl::Status s = ValidateGenerateRequest(r, limits, vocab);
  if (s.ok()) return "ok";
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST(RequestValidatorTest, AcceptsAValidRequest) {
  EXPECT_EQ(Error(Valid()), "ok");
  GenerateRequest no_docs;
  no_docs.set_question("hi");
  EXPECT_EQ(Error(no_docs), "ok");
  GenerateRequest docs_only;
  docs_only.add_documents()->set_text("x");
  EXPECT_EQ(Error(docs_only), "ok");
}

TEST(RequestValidatorTest, NamesTheBadField) {
  auto with = [](auto edit) {
    GenerateRequest r = Valid();
    edit(r);
    return Error(r);
  };
  EXPECT_EQ(with([](GenerateRequest& r) { r.add_documents()->set_text(""); }),
            "documents[2].text: empty document");
  EXPECT_EQ(with([](GenerateRequest& r) {
              for (int i = 0; i < 2; ++i) r.add_documents()->set_text("x");
            }),
            "documents: 4 documents, the limit is 3");
  EXPECT_EQ(
      with([](GenerateRequest& r) { r.mutable_documents(0)->set_text(std::string(17, 'x')); }),
      "documents[0].text: 17 bytes, the limit is 16");
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_documents(1)->mutable_tokens()->clear_ids(); }),
            "documents[1].tokens: empty document");
  EXPECT_EQ(with([](GenerateRequest& r) {
              for (int i = 0; i < 4; ++i) r.mutable_documents(1)->mutable_tokens()->add_ids(1);
            }),
            "documents[1].tokens: 5 tokens, the limit is 4");
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_documents(1)->mutable_tokens()->add_ids(-3); }),
            "documents[1].tokens.ids[1]: negative token id -3");
  EXPECT_THAT(
      with([](GenerateRequest& r) { r.mutable_documents(1)->mutable_tokens()->add_ids(1000); }),
      HasSubstr("documents[1].tokens.ids[1]: token id 1000 outside the vocabulary"));
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_documents(0)->clear_text(); }),
            "documents[0]: neither text nor tokens set");
  EXPECT_THAT(
      with([](GenerateRequest& r) { r.mutable_documents(0)->set_id(std::string(300, 'i')); }),
      HasSubstr("documents[0].id: 300 bytes"));
  EXPECT_EQ(with([](GenerateRequest& r) {
              r.clear_documents();
              r.clear_question();
            }),
            "question: empty question and no documents");
  EXPECT_THAT(with([](GenerateRequest& r) { r.set_question("123456789"); }),
              HasSubstr("question: 9 bytes"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.set_system("123456789"); }),
              HasSubstr("system: 9 bytes"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_temperature(-0.5f); }),
              HasSubstr("sampling.temperature"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_temperature(NAN); }),
              HasSubstr("sampling.temperature"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_top_k(-1); }),
              HasSubstr("sampling.top_k"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); }),
              HasSubstr("sampling.top_p"));
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(101); }),
            "sampling.max_tokens: 101 outside [0, 100]");
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(-1); }),
              HasSubstr("sampling.max_tokens"));
  EXPECT_THAT(with([](GenerateRequest& r) {
                r.mutable_sampling()->add_stop("a");
                r.mutable_sampling()->add_stop("b");
              }),
              HasSubstr("sampling.stop: 3 stop strings, the limit is 2"));
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->add_stop(""); }),
            "sampling.stop[1]: empty stop string");
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_stop(0, "12345"); }),
              HasSubstr("sampling.stop[0]: 5 bytes"));
  EXPECT_THAT(with([](GenerateRequest& r) {
                for (int i = 0; i < 3; ++i) r.mutable_sampling()->add_stop_token_ids(1);
              }),
              HasSubstr("sampling.stop_token_ids: 3 ids"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->add_stop_token_ids(-2); }),
              HasSubstr("sampling.stop_token_ids[0]: negative token id -2"));
  EXPECT_EQ(
      with([](GenerateRequest& r) { r.set_cache_mode(static_cast<lazyattn::v1::CacheMode>(9)); }),
      "cache_mode: unknown cache mode 9");
}

TEST(RequestValidatorTest, UnknownVocabularySkipsTheUpperBound) {
  GenerateRequest r = Valid();
  r.mutable_documents(1)->mutable_tokens()->add_ids(123456);
  EXPECT_EQ(Error(r, /*vocab=*/0), "ok");
}

TEST(RequestValidatorTest, Prefetch) {
  RequestLimits limits;
  limits.max_prefetch_replicas = 4;
  PrefetchRequest r;
  EXPECT_THAT(ValidatePrefetchRequest(r, limits, 0).message(),
              HasSubstr("documents: no documents"));
  r.add_documents()->set_text("doc");
  EXPECT_TRUE(ValidatePrefetchRequest(r, limits, 0).ok());
  r.set_replicas(5);
  EXPECT_THAT(ValidatePrefetchRequest(r, limits, 0).message(), HasSubstr("replicas: 5 outside"));
  r.set_replicas(2);
  r.set_cache_mode(lazyattn::v1::CACHE_MODE_FULL);
  EXPECT_THAT(ValidatePrefetchRequest(r, limits, 0).message(),
              HasSubstr("cache_mode: prefetch takes LAZY or BLOCK, got CACHE_MODE_FULL"));
  r.set_cache_mode(lazyattn::v1::CACHE_MODE_BLOCK);
  r.add_documents()->set_text("");
  EXPECT_EQ(ValidatePrefetchRequest(r, limits, 0).message(), "documents[1].text: empty document");
}

}  // namespace
}  // namespace lazyattn::router
