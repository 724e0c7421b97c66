#include "services/router/policy/worker_selector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace lazyattn::router {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// A tiny directory: which worker holds which documents (and how many tokens each).
struct Directory {
  std::map<std::string, std::map<DocumentKey, int64_t>> held;

  std::vector<WorkerObservation> Observe(const std::vector<DocumentRef>& docs) const {
    std::vector<WorkerObservation> out;
    for (const auto& [worker, keys] : held) {
      WorkerObservation obs{.id = worker};
      for (const DocumentRef& d : docs) {
        auto it = keys.find(d.key);
        obs.resident.push_back(it != keys.end());
        if (it != keys.end()) obs.resident_tokens += it->second;
      }
      out.push_back(obs);
    }
    return out;
  }
};

DocumentRef Doc(const std::string& text, int64_t tokens) {
  return {DocumentKeyFromText("model-fp", "tok-fp", text), tokens};
}

WorkerSelector MakeSelector(PolicyKind kind = PolicyKind::kCacheAware) {
  PolicyOptions p;
  p.kind = kind;
  return WorkerSelector(p, {.ttl = absl::Seconds(2), .max_keys = 1000},
                        {.failure_threshold = 2, .open_duration = absl::Seconds(5)});
}

TEST(WorkerSelectorTest, CacheAwarePicksTheHolderWhateverTheDocumentOrder) {
  const DocumentRef a = Doc("alpha", 300), b = Doc("beta", 200), c = Doc("gamma", 250);
  Directory dir;
  dir.held["w0"] = {{a.key, 300}, {b.key, 200}};  // 500 tokens of {a, b}
  dir.held["w1"] = {{c.key, 250}};
  dir.held["w2"] = {};
  WorkerSelector selector = MakeSelector();

  const std::vector<std::vector<DocumentRef>> orders = {{a, b}, {b, a}, {b, c, a}, {a, c, b}};
  for (const auto& docs : orders) {
    auto obs = dir.Observe(docs);
    Selection s = selector.Select(obs, docs, kT0);
    ASSERT_FALSE(s.order.empty());
    EXPECT_EQ(obs[s.order[0]].id, "w0");
    EXPECT_EQ(s.predicted_hit_tokens[s.order[0]], 500);
  }
  // Only c: w1 holds it.
  std::vector<DocumentRef> only_c = {c};
  auto obs = dir.Observe(only_c);
  EXPECT_EQ(obs[selector.Select(obs, only_c, kT0).order[0]].id, "w1");
}

TEST(WorkerSelectorTest, LoadComesFromTheRouterWhenHeartbeatsLag) {
  WorkerSelector selector = MakeSelector(PolicyKind::kLeastLoaded);
  std::vector<WorkerObservation> obs = {{.id = "w0", .requests = 0, .router_inflight = 3},
                                        {.id = "w1", .requests = 1}};
  EXPECT_EQ(obs[selector.Select(obs, {}, kT0).order[0]].id, "w1");
}

TEST(WorkerSelectorTest, SpeculativeEntrySteersABurstUntilItExpires) {
  const std::vector<DocumentRef> docs = {Doc("new-1", 400), Doc("new-2", 600)};
  const std::vector<DocumentRef> reversed = {docs[1], docs[0]};
  Directory dir;  // nobody holds them yet: the workers' events have not arrived
  dir.held["w0"] = {};
  dir.held["w1"] = {};
  dir.held["w2"] = {};
  WorkerSelector selector = MakeSelector();

  auto obs = dir.Observe(docs);
  Selection first = selector.Select(obs, docs, kT0);
  const std::string chosen = obs[first.order[0]].id;
  EXPECT_EQ(first.predicted_hit_tokens[first.order[0]], 0);
  selector.RecordChoice(docs, chosen, kT0);

  for (int i = 1; i <= 6; ++i) {
    const auto& burst_docs = i % 2 ? reversed : docs;
    auto o = dir.Observe(burst_docs);
    Selection s = selector.Select(o, burst_docs, kT0 + absl::Milliseconds(100 * i));
    EXPECT_EQ(o[s.order[0]].id, chosen) << "request " << i;
    EXPECT_EQ(s.predicted_hit_tokens[s.order[0]], 1000);
  }

  // After the TTL nothing steers: idle workers rotate, so the next three go to three workers.
  std::set<std::string> after;
  for (int i = 0; i < 3; ++i) {
    Selection s = selector.Select(obs, docs, kT0 + absl::Seconds(3));
    after.insert(obs[s.order[0]].id);
    EXPECT_EQ(s.predicted_hit_tokens[s.order[0]], 0);
  }
  EXPECT_EQ(after.size(), 3u);
}

TEST(WorkerSelectorTest, SpeculationDoesNotDoubleCountConfirmedDocuments) {
  const std::vector<DocumentRef> docs = {Doc("x", 100), Doc("y", 50)};
  Directory dir;
  dir.held["w0"] = {{docs[0].key, 120}};  // the directory knows x precisely
  WorkerSelector selector = MakeSelector();
  selector.RecordChoice(docs, "w0", kT0);
  auto obs = dir.Observe(docs);
  Selection s = selector.Select(obs, docs, kT0);
  EXPECT_EQ(s.predicted_hit_tokens[0], 120 + 50);
}

// Speculative entries follow the mode's rule, as the directory's answer does: a block request
// placed at offset 1 predicts nothing for a block request placing the same document at 97, nor
// for a lazy request; the same placement is predicted again.
TEST(WorkerSelectorTest, SpeculativeEntriesFollowTheRequestsModeAndOffsets) {
  const DocumentRef lazy = Doc("doc", 96);
  DocumentRef at1 = lazy, at97 = lazy, unplaced = lazy;
  at1.positional = at97.positional = unplaced.positional = true;
  at1.offset = 1;
  at1.relative_offset = 0;
  at97.offset = 97;
  at97.relative_offset = 96;
  Directory dir;
  dir.held["w0"] = {};
  dir.held["w1"] = {};
  WorkerSelector selector = MakeSelector();
  selector.RecordChoice(std::vector<DocumentRef>{at1}, "w1", kT0);
  selector.RecordChoice(std::vector<DocumentRef>{unplaced}, "w0", kT0);  // nothing to record

  auto predicted = [&](const DocumentRef& d) {
    const std::vector<DocumentRef> docs = {d};
    auto obs = dir.Observe(docs);
    Selection s = selector.Select(obs, docs, kT0 + absl::Milliseconds(100));
    return std::vector<int64_t>(s.predicted_hit_tokens.begin(), s.predicted_hit_tokens.end());
  };
  EXPECT_THAT(predicted(at1), ::testing::ElementsAre(0, 96));
  EXPECT_THAT(predicted(at97), ::testing::ElementsAre(0, 0));
  EXPECT_THAT(predicted(lazy), ::testing::ElementsAre(0, 0));
  EXPECT_THAT(predicted(unplaced), ::testing::ElementsAre(0, 0));
  // A lazy request's entry is no hit for a block request either.
  selector.RecordChoice(std::vector<DocumentRef>{lazy}, "w0", kT0);
  EXPECT_THAT(predicted(lazy), ::testing::ElementsAre(96, 0));
  EXPECT_THAT(predicted(at97), ::testing::ElementsAre(0, 0));
}

// An attempt holds its entries for longer than the TTL (until its first token can be due), and a
// zero hold ends them (an attempt that failed).
TEST(WorkerSelectorTest, SpeculativeHoldOutlivesTheTtlAndZeroEndsIt) {
  const std::vector<DocumentRef> docs = {Doc("held", 64)};
  Directory dir;
  dir.held["w0"] = {};
  dir.held["w1"] = {};
  WorkerSelector selector = MakeSelector();  // TTL 2 s
  selector.RecordChoice(docs, "w1", kT0, absl::Seconds(30));
  auto obs = dir.Observe(docs);
  EXPECT_THAT(selector.Select(obs, docs, kT0 + absl::Seconds(20)).predicted_hit_tokens,
              ::testing::ElementsAre(0, 64));
  selector.RecordChoice(docs, "w1", kT0 + absl::Seconds(21));  // first token: the TTL again
  EXPECT_THAT(selector.Select(obs, docs, kT0 + absl::Seconds(24)).predicted_hit_tokens,
              ::testing::ElementsAre(0, 0));
  selector.RecordChoice(docs, "w1", kT0 + absl::Seconds(25), absl::Seconds(30));
  selector.RecordChoice(docs, "w1", kT0 + absl::Seconds(26), absl::ZeroDuration());
  EXPECT_THAT(selector.Select(obs, docs, kT0 + absl::Seconds(26)).predicted_hit_tokens,
              ::testing::ElementsAre(0, 0));
}

// The directory's answer is the prediction: what it says a worker holds for this request's mode
// (here nothing on w0, whose copy is another offset's) is what the selector predicts and ranks by.
TEST(WorkerSelectorTest, PredictionIsTheDirectorysModeAwareAnswer) {
  DocumentRef d = Doc("doc", 96);
  d.positional = true;
  d.offset = 1;
  const std::vector<DocumentRef> docs = {d};
  std::vector<WorkerObservation> obs = {
      {.id = "w0", .resident_tokens = 0, .resident = {false}},
      {.id = "w1", .queued_prefill_tokens = 50, .resident_tokens = 96, .resident = {true}}};
  WorkerSelector selector = MakeSelector();
  Selection s = selector.Select(obs, docs, kT0);
  EXPECT_THAT(s.predicted_hit_tokens, ::testing::ElementsAre(0, 96));
  EXPECT_EQ(obs[s.order[0]].id, "w1");  // 96 hit tokens beat 50 queued
}

// A directory's answer is another process's data: counts at the int64 limits (a broken or hostile
// directory) overflow no sum (the sanitizer build would trap) and count as no more than the
// request's documents can have.
TEST(WorkerSelectorTest, DirectoryCountsAtTheInt64LimitsOverflowNothing) {
  DocumentRef a = Doc("alpha", 300), b = Doc("beta", 200);
  a.max_tokens = 300;
  b.max_tokens = 200;
  const std::vector<DocumentRef> docs = {a, b};
  WorkerSelector selector = MakeSelector();
  selector.RecordChoice(docs, "w0", kT0);  // a speculative hit on w0 for both documents
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  std::vector<WorkerObservation> obs = {
      {.id = "w0", .queued_prefill_tokens = kMin, .resident_tokens = kMax, .copyable_tokens = kMax},
      {.id = "w1", .queued_prefill_tokens = kMax, .resident_tokens = kMin, .copyable_tokens = kMin},
      {.id = "w2", .resident_tokens = 500, .resident = {true, true}}};
  Selection s = selector.Select(obs, docs, kT0);
  ASSERT_EQ(s.order.size(), 3u);
  // Residency unknown: capped at both documents' 500 tokens, plus both speculative hits.
  EXPECT_EQ(s.predicted_hit_tokens[0], 500 + 500);
  EXPECT_EQ(s.predicted_hit_tokens[1], 0);  // the speculative entries are w0's
  EXPECT_EQ(obs[s.order[0]].id, "w0");
  EXPECT_EQ(obs[s.order.back()].id, "w1");  // no hits, the most queued
}

// A worker may announce any entry (kvdir stores what it is told): one that claimed a request's
// document with 2^40 tokens drew every request carrying it, whatever its load, and read their
// prompts. Its claim now counts for no more than the documents marked resident can have, so a
// real holder with a shorter queue wins; copyable tokens are capped at the other documents'.
TEST(WorkerSelectorTest, AClaimOfMoreTokensThanTheDocumentsHaveIsCapped) {
  DocumentRef a = Doc("alpha", 300), b = Doc("beta", 200);
  a.max_tokens = 400;  // its text's bytes plus slack: above the estimate
  b.max_tokens = 200;
  const std::vector<DocumentRef> docs = {a, b};
  WorkerSelector selector = MakeSelector();
  std::vector<WorkerObservation> obs = {
      {.id = "liar",
       .queued_prefill_tokens = 350,
       .resident_tokens = int64_t{1} << 40,
       .resident = {true, false},
       .copyable_tokens = int64_t{1} << 40},
      {.id = "holder", .resident_tokens = 300, .resident = {true, false}}};
  Selection s = selector.Select(obs, docs, kT0);
  EXPECT_THAT(s.predicted_hit_tokens, ::testing::ElementsAre(400, 300));
  // liar: 400 hits + copy_token_weight * 200 copyable - 350 queued, below holder's 300.
  ASSERT_EQ(s.order.size(), 2u);
  EXPECT_EQ(obs[s.order[0]].id, "holder");
}

// A worker that reused none of what it claimed loses the ranking to an honest holder though its
// claim is larger; its prediction stays the claim (so its answers keep checking it). A
// prediction with a speculative part is no claim to check.
TEST(WorkerSelectorTest, AClaimItsWorkerNeverBoreOutCountsAtItsCredit) {
  const DocumentRef a = Doc("alpha", 300), b = Doc("beta", 200);
  const std::vector<DocumentRef> docs = {a, b};
  Directory dir;
  dir.held["liar"] = {{a.key, 300}, {b.key, 200}};
  dir.held["holder"] = {{a.key, 300}};
  WorkerSelector selector = MakeSelector();
  auto obs = dir.Observe(docs);
  EXPECT_EQ(obs[selector.Select(obs, docs, kT0).order[0]].id, "liar");
  for (int i = 0; i < 10; ++i) selector.claims().Observe("liar", 500, 0);
  const Selection s = selector.Select(obs, docs, kT0);
  EXPECT_EQ(obs[s.order[0]].id, "holder");
  EXPECT_THAT(s.predicted_hit_tokens, ::testing::ElementsAre(300, 500));  // holder, liar
  EXPECT_THAT(s.claimed_tokens, ::testing::ElementsAre(300, 500));

  const DocumentRef c = Doc("gamma", 100);
  const std::vector<DocumentRef> with_c = {a, c};
  const std::vector<DocumentRef> only_c = {c};
  selector.RecordChoice(only_c, "holder", kT0);
  auto obs_c = dir.Observe(with_c);
  const Selection sc = selector.Select(obs_c, with_c, kT0);
  EXPECT_THAT(sc.predicted_hit_tokens, ::testing::ElementsAre(400, 300));
  EXPECT_THAT(sc.claimed_tokens, ::testing::ElementsAre(-1, 300));
}

// Mode block's copyable tokens are claims too: they count at the worker's credit, and they are
// part of what its answers (hits + copies) are checked against.
TEST(WorkerSelectorTest, CopyableTokensAreClaimsCheckedAndDiscountedLikeHits) {
  const DocumentRef a = Doc("alpha", 300);
  const std::vector<DocumentRef> docs = {a};
  WorkerSelector selector = MakeSelector();
  std::vector<WorkerObservation> obs = {
      {.id = "copier", .resident = {false}, .copyable_tokens = 300},
      {.id = "idle", .resident = {false}}};
  Selection s = selector.Select(obs, docs, kT0);
  EXPECT_EQ(obs[s.order[0]].id, "copier");
  EXPECT_THAT(s.predicted_hit_tokens, ::testing::ElementsAre(0, 0));
  EXPECT_THAT(s.claimed_tokens, ::testing::ElementsAre(300, 0));
  for (int i = 0; i < 10; ++i) selector.claims().Observe("copier", 300, 0);
  // Its copies count 0 now: a tie, broken by rotation; over two selections each worker leads.
  std::set<std::string> first;
  for (int i = 0; i < 2; ++i) first.insert(obs[selector.Select(obs, docs, kT0).order[0]].id);
  EXPECT_THAT(first, ::testing::ElementsAre("copier", "idle"));
}

TEST(WorkerSelectorTest, OpenBreakerTakesAWorkerOutUntilItsProbe) {
  const DocumentRef a = Doc("alpha", 300);
  Directory dir;
  dir.held["w0"] = {{a.key, 300}};
  dir.held["w1"] = {};
  WorkerSelector selector = MakeSelector();
  selector.breakers().RecordFailure("w0", {}, kT0);
  selector.breakers().RecordFailure("w0", {}, kT0);

  std::vector<DocumentRef> docs = {a};
  auto obs = dir.Observe(docs);
  Selection s = selector.Select(obs, docs, kT0 + absl::Seconds(1));
  ASSERT_EQ(s.order.size(), 1u);
  EXPECT_EQ(obs[s.order[0]].id, "w1");

  // Open period over: w0 is offered again (first, it holds the document) and gets the probe.
  const absl::Time t1 = kT0 + absl::Seconds(5);
  s = selector.Select(obs, docs, t1);
  ASSERT_EQ(s.order.size(), 2u);
  EXPECT_EQ(obs[s.order[0]].id, "w0");
  const CircuitBreakers::Permit probe = selector.breakers().TryAcquire("w0", t1);
  EXPECT_TRUE(probe);
  s = selector.Select(obs, docs, t1);  // while the probe is out, others go elsewhere
  ASSERT_EQ(s.order.size(), 1u);
  EXPECT_EQ(obs[s.order[0]].id, "w1");
  selector.breakers().RecordSuccess("w0", probe, t1);
  s = selector.Select(obs, docs, t1);
  EXPECT_EQ(obs[s.order[0]].id, "w0");
}

TEST(WorkerSelectorTest, AllBreakersOpenOffersEveryWorker) {
  WorkerSelector selector = MakeSelector();
  for (const char* w : {"w0", "w1"}) {
    selector.breakers().RecordFailure(w, {}, kT0);
    selector.breakers().RecordFailure(w, {}, kT0);
  }
  std::vector<WorkerObservation> obs = {{.id = "w0"}, {.id = "w1"}};
  Selection s = selector.Select(obs, {}, kT0);
  EXPECT_TRUE(s.breaker_panic);
  EXPECT_EQ(s.order.size(), 2u);
}

TEST(WorkerSelectorTest, EjectedWorkerGetsNothingEvenHoldingTheDocuments) {
  const DocumentRef a = Doc("alpha", 300);
  Directory dir;
  dir.held["w0"] = {{a.key, 300}};
  dir.held["w1"] = {};
  WorkerSelector selector = MakeSelector();
  ASSERT_TRUE(selector.outliers().Record("w0", ProbeResult::kNotServing, kT0));
  std::vector<DocumentRef> docs = {a};
  auto obs = dir.Observe(docs);
  Selection s = selector.Select(obs, docs, kT0);
  ASSERT_EQ(s.order.size(), 1u);
  EXPECT_EQ(obs[s.order[0]].id, "w1");
  EXPECT_FALSE(s.breaker_panic);
  selector.outliers().Record("w0", ProbeResult::kServing, kT0 + absl::Minutes(1));
  s = selector.Select(obs, docs, kT0 + absl::Minutes(1));
  ASSERT_EQ(s.order.size(), 2u);
  EXPECT_EQ(obs[s.order[0]].id, "w0");
}

TEST(WorkerSelectorTest, BreakersOpenEverywherePrefersWorkersThatAreNotEjected) {
  WorkerSelector selector = MakeSelector();
  for (const char* w : {"w0", "w1"}) {
    selector.breakers().RecordFailure(w, {}, kT0);
    selector.breakers().RecordFailure(w, {}, kT0);
  }
  selector.outliers().Record("w0", ProbeResult::kNotServing, kT0);
  std::vector<WorkerObservation> obs = {{.id = "w0"}, {.id = "w1"}};
  Selection s = selector.Select(obs, {}, kT0);
  EXPECT_TRUE(s.breaker_panic);
  ASSERT_EQ(s.order.size(), 1u);
  EXPECT_EQ(obs[s.order[0]].id, "w1");
}

}  // namespace
}  // namespace lazyattn::router
