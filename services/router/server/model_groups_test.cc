// Grouping workers by model and resolving GenerateRequest.model (model_groups.h), the registry's
// groups, and the routing step's filter: no gRPC, no clock.
#include "services/router/server/model_groups.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/document_key.h"
#include "services/router/server/model_choice.h"
#include "services/router/server/request_fingerprint.h"
#include "services/router/server/router_context.h"
#include "services/router/server/worker_listing_for_test.h"
#include "services/router/server/worker_registry.h"

namespace lazyattn::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

using listing_test::kFpA;
using listing_test::kFpA2;
using listing_test::kFpB;
using listing_test::kTok1;
using listing_test::kTok2;
using listing_test::Listing;
using listing_test::Worker;

ModelGroup Group(const std::string& name, const std::string& mfp, const std::string& tfp,
                 int workers, absl::Time since = absl::UnixEpoch()) {
  ModelGroup g;
  g.key = {mfp, tfp};
  g.info.set_name(name);
  g.info.set_model_fingerprint(mfp);
  g.info.set_tokenizer_fingerprint(tfp);
  g.workers = workers;
  g.since = since;
  return g;
}

std::vector<std::string> Ids(const std::vector<ModelGroup>& groups) {
  std::vector<std::string> ids;
  for (const ModelGroup& g : groups) ids.push_back(g.id);
  return ids;
}

std::string Resolved(const std::vector<ModelGroup>& groups, std::string_view requested) {
  auto g = ResolveModel(groups, requested);
  if (!g.ok()) return absl::StrCat("error ", absl::StatusCodeToString(g.status().code()));
  return *g == nullptr ? "none" : (*g)->id;
}

TEST(ModelIdsTest, AUniqueNameIsTheIdAndASharedOneGetsTheFingerprint) {
  std::vector<ModelGroup> groups = {Group("llama", kFpB, kTok1, 1), Group("llama", kFpA, kTok1, 2),
                                    Group("smol", kFpA2, kTok1, 1)};
  AssignModelIds(groups);
  EXPECT_THAT(Ids(groups), ElementsAre("llama@aaaaaaaaaaaa", "llama@bbbbbbbbbbbb", "smol"));
  EXPECT_EQ(groups[0].info.id(), "llama@aaaaaaaaaaaa");
  EXPECT_EQ(groups[0].info.workers(), 2);
}

TEST(ModelIdsTest, SameWeightsWithTwoTokenizersAddTheTokenizerAndIdsStayUnique) {
  std::vector<ModelGroup> groups = {Group("m", kFpA, kTok1, 1), Group("m", kFpA, kTok2, 1),
                                    Group("m", kFpA2, kTok1, 1), Group("", kFpB, kTok1, 1)};
  AssignModelIds(groups);
  // kFpA and kFpA2 share their first 12 digits and a tokenizer: only whole fingerprints tell
  // them apart. A model without a name is named by its fingerprint.
  EXPECT_THAT(Ids(groups), ElementsAre("@bbbbbbbbbbbb", "m@aaaaaaaaaaaa.808080808080",
                                       "m@aaaaaaaaaaaa1111aaaa.7070707070701234",
                                       "m@aaaaaaaaaaaa2222aaaa.7070707070701234"));
}

TEST(ResolveModelTest, DefaultIsTheOnlyModelAndSeveralNamesMustBeChosen) {
  std::vector<ModelGroup> none;
  EXPECT_EQ(Resolved(none, ""), "none");
  EXPECT_EQ(Resolved(none, "smol"), "error UNAVAILABLE");

  std::vector<ModelGroup> one = {Group("smol", kFpA, kTok1, 1)};
  AssignModelIds(one);
  EXPECT_EQ(Resolved(one, ""), "smol");
  EXPECT_EQ(Resolved(one, "smol"), "smol");

  std::vector<ModelGroup> two = {Group("smol", kFpA, kTok1, 3), Group("llama", kFpB, kTok1, 1)};
  AssignModelIds(two);
  auto missing = ResolveModel(two, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("model: required"));
  EXPECT_THAT(missing.status().message(), HasSubstr("llama, smol"));
  EXPECT_EQ(Resolved(two, "llama"), "llama");
  EXPECT_EQ(Resolved(two, "smol"), "smol");
}

TEST(ResolveModelTest, UnknownIsNotFoundNamingItAndTheChoices) {
  std::vector<ModelGroup> groups = {Group("smol", kFpA, kTok1, 1), Group("llama", kFpB, kTok1, 1)};
  AssignModelIds(groups);
  auto r = ResolveModel(groups, "gpt-4o");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("model: \"gpt-4o\" is not served"));
  EXPECT_THAT(r.status().message(), HasSubstr("served: llama, smol"));
  // A name with another's fingerprint, or a fingerprint prefix that is no one's.
  EXPECT_EQ(Resolved(groups, "smol@bbbb"), "error NOT_FOUND");
  EXPECT_EQ(Resolved(groups, "smol@ffff"), "error NOT_FOUND");
  EXPECT_EQ(Resolved(groups, "smol@"), "error NOT_FOUND");
  EXPECT_EQ(Resolved(groups, "@aaaa"), "error NOT_FOUND");
}

TEST(ResolveModelTest, BadValuesAreInvalidArgumentNamingTheField) {
  std::vector<ModelGroup> groups = {Group("smol", kFpA, kTok1, 1)};
  AssignModelIds(groups);
  auto bad_utf8 = ResolveModel(groups, "sm\xffol");
  ASSERT_FALSE(bad_utf8.ok());
  EXPECT_EQ(bad_utf8.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_utf8.status().message(), HasSubstr("model: not valid UTF-8 (byte 2)"));
  auto long_name = ResolveModel(groups, std::string(kMaxModelBytes + 1, 'x'));
  ASSERT_FALSE(long_name.ok());
  EXPECT_EQ(long_name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_name.status().message(), HasSubstr("model: 257 bytes"));
  // Within the limit but unknown: quoted up to 64 bytes, cut at a character boundary.
  std::string quoted = std::string(63, 'x') + "\xc3\xa9" + "tail";
  auto unknown = ResolveModel(groups, quoted);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr(std::string(63, 'x') + "...\""));
}

TEST(ResolveModelTest, ASharedNameFollowsTheMajorityAndAPrefixPinsAVersion) {
  const absl::Time old_since = absl::UnixEpoch();
  const absl::Time new_since = old_since + absl::Minutes(5);
  // The upgrade begins: three old workers, one new.
  std::vector<ModelGroup> groups = {Group("llama", kFpA, kTok1, 3, old_since),
                                    Group("llama", kFpB, kTok1, 1, new_since)};
  AssignModelIds(groups);
  EXPECT_EQ(Resolved(groups, "llama"), "llama@aaaaaaaaaaaa");
  EXPECT_EQ(Resolved(groups, ""), "llama@aaaaaaaaaaaa");  // one name: still "the only model"
  EXPECT_EQ(Resolved(groups, "llama@bbbb"), "llama@bbbbbbbbbbbb");
  EXPECT_EQ(Resolved(groups, "llama@BBBBBBBBBBBB0000"), "llama@bbbbbbbbbbbb");
  EXPECT_EQ(Resolved(groups, "llama@bbbbbbbbbbbb"), "llama@bbbbbbbbbbbb");
  // Half way: a tie goes to the newer version.
  groups[0].workers = 2;
  groups[1].workers = 2;
  EXPECT_EQ(Resolved(groups, "llama"), "llama@bbbbbbbbbbbb");
  // The same tie whatever the order the groups come in.
  std::swap(groups[0], groups[1]);
  EXPECT_EQ(Resolved(groups, "llama"), "llama@bbbbbbbbbbbb");
}

TEST(ResolveModelTest, APrefixMatchingSeveralIsInvalidArgumentListingThem) {
  std::vector<ModelGroup> groups = {Group("m", kFpA, kTok1, 1), Group("m", kFpA2, kTok1, 1),
                                    Group("m", kFpA, kTok2, 1)};
  AssignModelIds(groups);
  auto r = ResolveModel(groups, "m@aaaa");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("matches 3 models"));
  // Longer prefixes, or the tokenizer's, tell them apart.
  auto a2 = ResolveModel(groups, "m@aaaaaaaaaaaa2");
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ((*a2)->key.model_fingerprint, kFpA2);
  auto tok2 = ResolveModel(groups, "m@aaaa.8080");
  ASSERT_TRUE(tok2.ok());
  EXPECT_EQ((*tok2)->key, (ModelKey{kFpA, kTok2}));
  auto tok1 = ResolveModel(groups, "m@aaaaaaaaaaaa1.7070");
  ASSERT_TRUE(tok1.ok());
  EXPECT_EQ((*tok1)->key, (ModelKey{kFpA, kTok1}));
  // Every assigned id selects its own group.
  for (const ModelGroup& g : groups) {
    auto self = ResolveModel(groups, g.id);
    ASSERT_TRUE(self.ok()) << g.id << ": " << self.status();
    EXPECT_EQ((*self)->key, g.key) << g.id;
  }
}

// --- The registry's groups ---------------------------------------------------------------------

TEST(WorkerRegistryModelsTest, GroupsReportedWorkersByFingerprintsAndTracksARollingUpgrade) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  EXPECT_TRUE(registry.Models().empty());
  registry.ObserveDirectory(Listing({Worker("w0", "llama", kFpA), Worker("w1", "llama", kFpA),
                                     Worker("w2", "", "")}),  // no model reported: in no group
                            t0);
  std::vector<ModelGroup> models = registry.Models();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].id, "llama");
  EXPECT_EQ(models[0].workers, 2);
  EXPECT_EQ(models[0].since, t0);
  ASSERT_TRUE(registry.Model().has_value());
  EXPECT_EQ(registry.Model()->model_fingerprint(), kFpA);

  // w1 restarts with the new weights under the same name.
  registry.ObserveDirectory(
      Listing({Worker("w0", "llama", kFpA), Worker("w1", "llama", kFpB), Worker("w2", "", "")}),
      t0 + absl::Seconds(1));
  models = registry.Models();
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].id, "llama@aaaaaaaaaaaa");
  EXPECT_EQ(models[1].id, "llama@bbbbbbbbbbbb");
  EXPECT_EQ(models[0].since, t0);
  EXPECT_EQ(models[1].since, t0 + absl::Seconds(1));
  EXPECT_FALSE(registry.Model().has_value());  // several: callers must resolve
  // One each: the tie goes to the newer weights.
  auto plain = registry.ResolveModel("llama");
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(plain->has_value());
  EXPECT_EQ((*plain)->key.model_fingerprint, kFpB);
  auto pinned = registry.ResolveModel("llama@aaaa");
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ((*pinned)->key.model_fingerprint, kFpA);

  // w0 is gone for longer than forget_after: only the new weights remain.
  registry.ObserveDirectory(Listing({Worker("w1", "llama", kFpB)}), t0 + absl::Seconds(20));
  models = registry.Models();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].id, "llama");
  auto old = registry.ResolveModel("llama@aaaa");
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kNotFound);
}

// Workers of one model configured apart: the group's document limit (what the router admits and
// GetModelInfo reports) is the smallest of theirs, whichever worker sorts first; 0 (a worker
// that reported none) does not count.
TEST(WorkerRegistryModelsTest, AGroupTakesTheSmallestDocumentLimitOfItsWorkers) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  registry.ObserveDirectory(
      Listing({Worker("w0", "llama", kFpA, 1000, 32), Worker("w1", "llama", kFpA, 1000, 0),
               Worker("w2", "llama", kFpA, 1000, 2)}),
      t0);
  std::vector<ModelGroup> models = registry.Models();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].workers, 3);
  EXPECT_EQ(models[0].info.max_documents(), 2);
  ASSERT_TRUE(registry.Model().has_value());
  EXPECT_EQ(registry.Model()->max_documents(), 2);
  // The small worker gone, the limit is the others' again.
  registry.ObserveDirectory(
      Listing({Worker("w0", "llama", kFpA, 1000, 32), Worker("w1", "llama", kFpA, 1000, 0)}),
      t0 + absl::Seconds(20));
  EXPECT_EQ(registry.Model()->max_documents(), 32);
}

TEST(ModelChoiceTest, TokenIdsAreCheckedAgainstTheChosenModelsVocabulary) {
  WorkerRegistry registry({}, TlsOptions{}, 1 << 20, absl::Seconds(10),
                          /*directory_on_this_host=*/true);
  registry.ObserveDirectory(Listing({Worker("w0", "small", kFpA, /*vocab=*/100,
                                            /*max_documents=*/4),
                                     Worker("w1", "big", kFpB, /*vocab=*/50000)}),
                            absl::UnixEpoch());
  lazyattn::v1::GenerateRequest request;
  request.add_documents()->mutable_tokens()->add_ids(4000);
  request.set_question("q");
  request.set_model("big");
  auto big = ChooseModel(registry, ApiLimits{}, request);
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_TRUE(big->has_value());
  EXPECT_EQ((*big)->id, "big");
  request.set_model("small");
  auto small = ChooseModel(registry, ApiLimits{}, request);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("documents[0].tokens.ids[0]"));

  // The chosen model's document limit too (admission knows none while two models are served).
  lazyattn::v1::GenerateRequest many;
  many.set_question("q");
  many.set_model("big");
  for (int i = 0; i < 5; ++i) many.add_documents()->set_text(absl::StrCat("doc ", i));
  EXPECT_TRUE(ChooseModel(registry, ApiLimits{}, many).ok());
  many.set_model("small");
  auto too_many = ChooseModel(registry, ApiLimits{}, many);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_many.status().message(),
              HasSubstr("documents: 5 documents, the workers of model small take at most 4"));

  lazyattn::v1::PrefetchRequest prefetch;
  prefetch.add_documents()->mutable_tokens()->add_ids(4000);
  prefetch.set_model("small");
  EXPECT_FALSE(ChooseModel(registry, ApiLimits{}, prefetch).ok());
  prefetch.set_model("big");
  EXPECT_TRUE(ChooseModel(registry, ApiLimits{}, prefetch).ok());
}

// --- The routing step: keys and candidates of the chosen model only -----------------------------

TEST(RouterContextModelsTest, PlansHoldOnlyTheChosenModelsWorkersAndKeysUseItsFingerprints) {
  RouterOptions options;
  options.health.interval = absl::ZeroDuration();  // no prober thread
  // A one-host cluster, whose listed 127.0.0.1 workers are dialled; never called here.
  options.kvdir.address = "127.0.0.1:1";
  prometheus::Registry metrics;
  RouterContext router(options, metrics);
  const absl::Time now = absl::Now();
  router.registry().ObserveDirectory(Listing({Worker("w0", "a", kFpA), Worker("w1", "a", kFpA),
                                              Worker("w2", "b", kFpB), Worker("w3", "b", kFpB)}),
                                     now);
  const ModelKey a{kFpA, kTok1};
  const ModelKey b{kFpB, kTok1};

  google::protobuf::RepeatedPtrField<lazyattn::v1::Document> docs;
  docs.Add()->set_text("the manual");
  std::vector<DocumentRef> refs_b = router.DocumentRefs(docs, lazyattn::v1::CACHE_MODE_LAZY, &b);
  ASSERT_EQ(refs_b.size(), 1u);
  EXPECT_EQ(refs_b[0].key, DocumentKeyFromText(kFpB, kTok1, "the manual"));
  std::vector<DocumentRef> refs_a = router.DocumentRefs(docs, lazyattn::v1::CACHE_MODE_LAZY, &a);
  ASSERT_EQ(refs_a.size(), 1u);
  EXPECT_EQ(refs_a[0].key, DocumentKeyFromText(kFpA, kTok1, "the manual"));
  // In a cache scope the keys are the scope's, as the workers cache and publish them.
  const CacheScope scope{"tenant", "salt"};
  std::vector<DocumentRef> scoped =
      router.DocumentRefs(docs, lazyattn::v1::CACHE_MODE_LAZY, &a, scope);
  ASSERT_EQ(scoped.size(), 1u);
  EXPECT_EQ(scoped[0].key,
            ScopedDocumentKey(DocumentKeyFromText(kFpA, kTok1, "the manual"), scope));
  EXPECT_NE(scoped[0].key, refs_a[0].key);
  // Without a chosen model and with two served, there is no key to route on.
  EXPECT_TRUE(router.DocumentRefs(docs, lazyattn::v1::CACHE_MODE_LAZY).empty());

  // The directory says w0 (model a) holds B's key for the document (it cannot, but the answer is
  // not trusted to be about one model) and w3 holds it too.
  lazyattn::v1::LookupResponse lookup;
  for (const auto& w : Listing({Worker("w0", "a", kFpA), Worker("w1", "a", kFpA),
                                Worker("w2", "b", kFpB), Worker("w3", "b", kFpB)})) {
    auto* r = lookup.add_workers();
    *r = w;
    const bool holds = r->worker().worker_id() == "w0" || r->worker().worker_id() == "w3";
    r->add_resident(holds);
    r->set_resident_tokens(holds ? 500 : 0);
  }
  RoutePlan plan_b = router.Plan(refs_b, &lookup, now, &b);
  std::vector<std::string> ids;
  for (const WorkerInfo& w : plan_b.workers) ids.push_back(w.id);
  EXPECT_THAT(ids, ElementsAre("w3", "w2"));  // the holder first, and nobody of model a
  RoutePlan plan_a = router.Plan(refs_a, nullptr, now, &a);
  ids.clear();
  for (const WorkerInfo& w : plan_a.workers) ids.push_back(w.id);
  EXPECT_THAT(ids, UnorderedElementsAre("w0", "w1"));
  // No model known to the request (none reported): every worker, as before models existed.
  RoutePlan any = router.Plan({}, nullptr, now);
  EXPECT_EQ(any.workers.size(), 4u);
}

// --- The quarantine's fingerprint: per model, whatever the spelling of its name -----------------

TEST(RequestFingerprintTest, CoversTheChosenModelButNotHowTheRequestNamedIt) {
  lazyattn::v1::GenerateRequest request;
  request.set_question("crash me");
  request.add_documents()->set_text("doc");
  const ModelKey a{kFpA, kTok1};
  const ModelKey b{kFpB, kTok1};
  lazyattn::v1::GenerateRequest by_name = request;
  by_name.set_model("llama");
  lazyattn::v1::GenerateRequest by_prefix = request;
  by_prefix.set_model("llama@aaaa");
  EXPECT_EQ(FingerprintOf(by_name, &a), FingerprintOf(by_prefix, &a));
  EXPECT_EQ(FingerprintOf(request, &a), FingerprintOf(by_name, &a));
  EXPECT_NE(FingerprintOf(by_name, &a), FingerprintOf(by_name, &b));
  EXPECT_NE(FingerprintOf(request, &a), FingerprintOf(request, nullptr));
  // Fingerprints are length-prefixed: moving bytes between them changes the value.
  const ModelKey shifted{std::string(kFpA) + "7", std::string(kTok1).substr(1)};
  EXPECT_NE(FingerprintOf(request, &a), FingerprintOf(request, &shifted));
  lazyattn::v1::GenerateRequest other = by_name;
  other.set_question("crash me too");
  EXPECT_NE(FingerprintOf(by_name, &a), FingerprintOf(other, &a));
}

}  // namespace
}  // namespace lazyattn::router
