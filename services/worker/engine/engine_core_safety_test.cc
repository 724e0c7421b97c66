// What no request may do to the engine core: duplicate documents, cancellations and deadlines at
// any step, failed steps, admission past the pool, a corrupted pool. After each, every request
// has ended exactly once and the KV pool is whole.
#include <functional>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/engine_core_safety_test_fixture.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/engine/scripted_cpu_runner_for_test.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

using engine_core_safety_testing::EngineCoreSafetyTest;
using engine_core_safety_testing::Outcome;
using testing::ScriptedCpuRunner;

constexpr float kModeTolerance = 1e-4f;

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// The same document several times in one request is legal, and computes what distinct
// documents with the same tokens compute (here: the same tokens under other keys), in every mode.
TEST_F(EngineCoreSafetyTest, RepeatedDocumentEqualsDistinctCopies) {
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock, CacheMode::kPrefix, CacheMode::kFull}) {
    SCOPED_TRACE(CacheModeName(mode));
    Init();
    const EngineRequest repeated = Request({1, 0, 1, 1}, mode);
    PreparedRequest distinct = Prepare(repeated);
    for (size_t i = 0; i < distinct.documents.size(); ++i) {
      distinct.documents[i].key.hi ^= i + 1;  // other keys, same tokens
    }
    const Outcome a = RunOne(repeated);
    Init();
    Add(std::move(distinct));
    Drain();
    const Outcome b = Last();
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status << b.status;
    EXPECT_EQ(a.result.token_ids, b.result.token_ids);
    EXPECT_LT(MaxDiff(a.result.first_logits, b.result.first_logits), kModeTolerance);
    // Warm: the repeated request again, from the cache.
    const Outcome warm = RunOne(repeated);
    ASSERT_TRUE(warm.status.ok()) << warm.status;
    EXPECT_EQ(warm.result.token_ids, a.result.token_ids);
  }
}

// A document repeated in a lazy request is encoded once (one key at every offset), so its repeats
// are reported cached, not computed: computed_tokens is what the worker computed. Block mode
// keys documents by offset and encodes each occurrence, so there every token is computed.
TEST_F(EngineCoreSafetyTest, ARepeatedDocumentIsComputedOnceAndReportedSo) {
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock}) {
    SCOPED_TRACE(CacheModeName(mode));
    Init();
    const EngineRequest repeated = Request({1, 0, 1, 1}, mode);
    const PreparedRequest prepared = Prepare(repeated);
    const int64_t repeat = static_cast<int64_t>(prepared.documents[0].tokens.size());
    ASSERT_GT(repeat, 0);
    const Outcome a = RunOne(repeated);
    ASSERT_TRUE(a.status.ok()) << a.status;
    const RequestUsage& u = a.result.usage;
    const int64_t cached = mode == CacheMode::kLazy ? 2 * repeat : 0;
    EXPECT_EQ(u.cached_tokens, cached);
    EXPECT_EQ(u.document_cached_tokens, cached);
    EXPECT_EQ(u.computed_tokens, u.prompt_tokens - cached);
    EXPECT_EQ(u.document_hit_tokens, 0) << "nothing was cached before the request";

    // Warm, the same request again: every occurrence comes from the cache. Lazy holds one key
    // for the three occurrences of document 1, so it is one hit (what the router predicts: it
    // counts each document of a request once) and its repeats are cached tokens, as cold; block
    // keys each occurrence by its offset, so each is a hit of its own.
    const int64_t other = static_cast<int64_t>(prepared.documents[1].tokens.size());
    const Outcome warm = RunOne(repeated);
    ASSERT_TRUE(warm.status.ok()) << warm.status;
    const RequestUsage& w = warm.result.usage;
    EXPECT_EQ(w.document_cached_tokens, 3 * repeat + other);
    if (mode == CacheMode::kLazy) {
      EXPECT_EQ(w.document_hit_tokens, repeat + other);
      EXPECT_EQ(w.documents_hit, 2);
    } else {
      EXPECT_EQ(w.document_hit_tokens, 3 * repeat + other);
      EXPECT_EQ(w.documents_hit, 4);
    }
  }
}

// KV cached under one cache scope (an API key's namespace, a cache_salt) serves only requests of
// that scope: another scope, and the shared one, hit none of its documents or prefix blocks, and
// compute the same tokens themselves; each scope then hits its own.
TEST_F(EngineCoreSafetyTest, CacheScopesShareNoKv) {
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock, CacheMode::kPrefix}) {
    SCOPED_TRACE(CacheModeName(mode));
    Init();
    EngineRequest a = Request({1, 2}, mode);
    a.cache_scope = {"tenant-a", ""};
    EngineRequest b = a;
    b.cache_scope = {"tenant-b", ""};
    EngineRequest salted = a;
    salted.cache_scope.salt = "per-user";
    EngineRequest shared = a;
    shared.cache_scope = {};

    const Outcome first = RunOne(a);
    ASSERT_TRUE(first.status.ok()) << first.status;
    for (const EngineRequest* other : {&b, &salted, &shared}) {
      const Outcome o = RunOne(*other);
      ASSERT_TRUE(o.status.ok()) << o.status;
      EXPECT_EQ(o.result.usage.cached_tokens, 0) << other->cache_scope.cache_namespace;
      EXPECT_EQ(o.result.usage.documents_hit, 0);
      EXPECT_EQ(o.result.usage.document_hit_tokens, 0);
      EXPECT_EQ(o.result.token_ids, first.result.token_ids);
    }
    for (const EngineRequest* again : {&a, &b, &salted, &shared}) {
      const Outcome o = RunOne(*again);
      ASSERT_TRUE(o.status.ok()) << o.status;
      EXPECT_GT(o.result.usage.cached_tokens, 0) << again->cache_scope.cache_namespace;
      if (mode != CacheMode::kPrefix) {
        EXPECT_EQ(o.result.usage.documents_hit, 2);
      }
      EXPECT_EQ(o.result.token_ids, first.result.token_ids);
    }
  }
}

// The reported crash: a request naming one uncached document twice, cancelled (or past its
// deadline) at every step of its encoding and generation, alone and beside another request that
// shares the document.
TEST_F(EngineCoreSafetyTest, CancelOrDeadlineAtEveryStepWithRepeatedDocuments) {
  const EngineRequest dup = Request({3, 3}, CacheMode::kLazy, 4);
  const EngineRequest other = Request({3, 2}, CacheMode::kLazy, 4);
  const Outcome reference = RunOne(other);
  ASSERT_TRUE(reference.status.ok());
  for (bool deadline : {false, true}) {
    for (int k = 0; k < 24; ++k) {
      SCOPED_TRACE(::testing::Message() << (deadline ? "deadline" : "cancel") << " after step " << k);
      Init();
      const absl::Time t0 = MonotonicNow();
      PreparedRequest p = Prepare(dup);
      if (deadline) p.deadline = t0 + absl::Seconds(k + 1);
      const uint64_t id = Add(std::move(p));
      Add(other);
      for (int s = 0; s <= k && core_->HasWork(); ++s) core_->Step(t0 + absl::Seconds(s));
      if (!deadline) core_->Cancel(id);
      Drain(t0 + absl::Seconds(k + 1));
      // The other request is untouched by the first one's end.
      EXPECT_TRUE(Last().status.ok()) << Last().status;
      EXPECT_EQ(Last().result.token_ids, reference.result.token_ids);
      // And the worker goes on: a later request is served normally.
      const Outcome after = RunOne(other);
      EXPECT_TRUE(after.status.ok()) << after.status;
      EXPECT_EQ(after.result.token_ids, reference.result.token_ids);
      EXPECT_TRUE(core_->health().ok());
    }
  }
}

// Preemption under a small pool with repeated documents: every request completes, and with
// the tokens it gets alone.
TEST_F(EngineCoreSafetyTest, PreemptionWithRepeatedDocumentsKeepsEveryAnswer) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(Request({i % 3, i % 3, (i + 1) % 3}, CacheMode::kLazy, 40));
  }
  std::vector<std::vector<int32_t>> alone;
  for (const EngineRequest& r : requests) {
    Init();
    const Outcome o = RunOne(r);
    ASSERT_TRUE(o.status.ok()) << o.status;
    alone.push_back(o.result.token_ids);
  }
  Init(/*blocks=*/64, /*max_batch_tokens=*/32);
  for (const EngineRequest& r : requests) Add(r);
  Drain();
  EXPECT_GT(core_->stats().preemptions, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Outcome& o = outcomes_[keys_[i]];
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.result.token_ids, alone[i]) << "request " << i;
  }
}

// A failed step at any point leaves nothing waiting, and the next request works. A step of one
// encoding fails every request waiting for it; one of several items runs them alone
// (engine_core_isolation_test.cc).
TEST_F(EngineCoreSafetyTest, FailedStepLeavesNothingWaiting) {
  for (int fail_at = 0; fail_at < 8; ++fail_at) {
    SCOPED_TRACE(::testing::Message() << "failing step " << fail_at);
    Init();
    Add(Request({4, 4}, CacheMode::kLazy));
    Add(Request({4, 1}, CacheMode::kLazy));
    Add(Request({4}, CacheMode::kBlock));
    for (int s = 0; s < fail_at; ++s) core_->Step(MonotonicNow());
    runner_->fail_next = 1;
    Drain();
    int failed = 0;
    for (uint64_t key : keys_) {
      const absl::Status& st = outcomes_[key].status;
      EXPECT_TRUE(st.ok() || st.code() == absl::StatusCode::kInternal) << st;
      failed += !st.ok();
    }
    if (fail_at == 0) {
      // The first step is the lazy encoding of document 4 alone (it fills the token budget):
      // both lazy requests wait for it and fail; the block request's own encoding was not run.
      EXPECT_EQ(failed, 2);
      EXPECT_TRUE(outcomes_[keys_[2]].status.ok()) << outcomes_[keys_[2]].status;
    }
    const Outcome after = RunOne(Request({4, 4}, CacheMode::kLazy));
    EXPECT_TRUE(after.status.ok()) << after.status;
  }
}

// A step its runner refuses as bad input (the CPU and CUDA runners check every chunk) is the
// engine's fault: the inputs were checked when the requests arrived. Its requests end INTERNAL
// with the runner's message, not INVALID_ARGUMENT, which would tell their clients that their
// requests were bad and not to retry them. A device's own codes are kept.
TEST_F(EngineCoreSafetyTest, ARunnerRefusingAStepFailsItsRequestsInternal) {
  for (const absl::Status& refusal :
       {absl::InvalidArgumentError("forward chunk 0: a position past the context"),
        absl::OutOfRangeError("forward chunk 0: a slot past the pool"),
        absl::ResourceExhaustedError("out of device memory")}) {
    SCOPED_TRACE(refusal.ToString());
    Init();
    Add(Request({4}, CacheMode::kLazy));
    runner_->fail_next = 1;
    runner_->fail_with = refusal;
    Drain();
    const absl::Status& st = outcomes_[keys_[0]].status;
    const bool reads_as_clients_fault = refusal.code() != absl::StatusCode::kResourceExhausted;
    EXPECT_EQ(st.code(), reads_as_clients_fault ? absl::StatusCode::kInternal : refusal.code())
        << st;
    EXPECT_NE(st.message().find(refusal.message()), std::string::npos) << st;
  }
}

// Admission counts what it admitted before in the same pass (and what running prefills still
// have to allocate): two requests that each need most of the pool are not admitted together.
TEST_F(EngineCoreSafetyTest, AdmissionReservesWhatItAdmits) {
  Init(/*blocks=*/48);
  // Each needs 2 (prefix) + 32 (document 9: 510 tokens) + 1 (query) blocks, more than half of 48.
  Add(Request({9}, CacheMode::kLazy, 4));
  PreparedRequest second = Prepare(Request({9}, CacheMode::kLazy, 4));
  second.documents[0].key.hi ^= 1;  // another document with the same length
  Add(std::move(second));
  core_->Step(MonotonicNow());
  EXPECT_EQ(core_->Load().running, 1);
  EXPECT_EQ(core_->Load().waiting, 1);
  Drain();
  EXPECT_EQ(core_->stats().preemptions, 0);
  for (uint64_t key : keys_) EXPECT_TRUE(outcomes_[key].status.ok()) << outcomes_[key].status;
}

TEST_F(EngineCoreSafetyTest, RequestThatCanNeverFitIsAFailedPrecondition) {
  Init(/*blocks=*/8);
  const Outcome o = RunOne(Request({9}, CacheMode::kLazy));
  EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(o.status.message().find("KV blocks"), std::string::npos) << o.status;
  // A repeated document counts once in mode lazy, which stores it once.
  Init(/*blocks=*/40);
  EXPECT_TRUE(RunOne(Request({9, 9}, CacheMode::kLazy)).status.ok());
}

// A Prefetch is its documents and a one-token question: when they cannot fit together (the KV
// pool, the context), the refusal names `documents`, not a prompt or a max_tokens its caller
// never sent.
TEST_F(EngineCoreSafetyTest, APrefetchThatCannotFitNamesItsDocuments) {
  Init(/*blocks=*/8);
  EngineRequest too_big = Request({9}, CacheMode::kLazy, /*max_tokens=*/1);
  too_big.prefetch = true;
  const Outcome o = RunOne(too_big);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
  EXPECT_EQ(o.status.message().rfind("documents: need ", 0), 0u) << o.status;
  EXPECT_NE(o.status.message().find("send fewer documents per Prefetch"), std::string::npos)
      << o.status;

  Init(/*blocks=*/512);
  const int64_t context = weights_->config.max_positions;
  EngineRequest long_docs = Request({0, 1}, CacheMode::kLazy, /*max_tokens=*/1);
  long_docs.prefetch = true;
  PreparedRequest p = Prepare(long_docs);
  p.documents[0].tokens.resize(context, 1);
  Add(std::move(p));
  EXPECT_EQ(Last().status.code(), absl::StatusCode::kInvalidArgument) << Last().status;
  EXPECT_EQ(Last().status.message().rfind("documents: ", 0), 0u) << Last().status;
  EXPECT_NE(Last().status.message().find("together leave no room"), std::string::npos)
      << Last().status;
}

// What PrepareRequest refuses is refused by the core too, whoever prepared the request: each ends
// with InvalidArgument naming the part, nothing runs for it, and the core keeps serving.
TEST_F(EngineCoreSafetyTest, RequestsTheModelCannotComputeAreRefusedByTheCore) {
  const int64_t vocab = weights_->config.vocab_size;
  const int64_t context = weights_->config.max_positions;
  struct Case {
    std::function<void(PreparedRequest&)> spoil;
    std::string names;
  };
  const std::vector<Case> cases = {
      {[](PreparedRequest& p) { p.documents[1].tokens.clear(); }, "documents[1]: no tokens"},
      {[](PreparedRequest& p) { p.question.clear(); }, "question: no tokens"},
      {[&](PreparedRequest& p) { p.documents[0].tokens[7] = static_cast<int32_t>(vocab); },
       "documents[0].tokens[7]"},
      {[](PreparedRequest& p) { p.question[2] = -1; }, "question[2] = -1"},
      {[&](PreparedRequest& p) { p.system_prefix[0] = static_cast<int32_t>(vocab + 5); },
       "system_prefix[0]"},
      {[&](PreparedRequest& p) { p.documents[0].tokens.resize(context, 1); }, "prompt: "},
  };
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock, CacheMode::kPrefix}) {
    for (const Case& c : cases) {
      if (mode == CacheMode::kPrefix && c.names == "documents[1]: no tokens") continue;  // below
      SCOPED_TRACE(std::string(CacheModeName(mode)) + ": " + c.names);
      Init(/*blocks=*/512);
      PreparedRequest p = Prepare(Request({0, 1}, mode));
      c.spoil(p);
      Add(std::move(p));
      EXPECT_EQ(Last().calls, 1);  // at once, from Add
      EXPECT_EQ(Last().status.code(), absl::StatusCode::kInvalidArgument) << Last().status;
      EXPECT_NE(Last().status.message().find(c.names), std::string::npos) << Last().status;
      const Outcome good = RunOne(Request({0, 1}, mode));
      EXPECT_TRUE(good.status.ok()) << good.status;
      EXPECT_TRUE(core_->health().ok()) << core_->health();
      EXPECT_EQ(core_->stats().encode_jobs, mode == CacheMode::kPrefix ? 0 : 2);
    }
  }
  // Modes full and prefix read the prompt whole: there a document may rightly have no tokens of
  // its own (its bytes all in the next one's first token), and the request is served.
  for (CacheMode mode : {CacheMode::kFull, CacheMode::kPrefix}) {
    Init(/*blocks=*/512);
    PreparedRequest p = Prepare(Request({0, 1}, mode));
    p.documents[0].tokens.clear();
    Add(std::move(p));
    Drain();
    EXPECT_TRUE(Last().status.ok()) << std::string(CacheModeName(mode)) << ": " << Last().status;
  }
}

TEST_F(EngineCoreSafetyTest, RequestsWithoutDeadlineGetTheDefault) {
  Init(256, 64, {.default_deadline = absl::Seconds(5)});
  const absl::Time t0 = MonotonicNow();
  PreparedRequest p = Prepare(Request({0}, CacheMode::kLazy, 1000));
  p.submitted = t0;
  Add(std::move(p));
  core_->Step(t0);
  EXPECT_EQ(core_->NextDeadline(), t0 + absl::Seconds(5));
  Drain(t0 + absl::Seconds(6));
  EXPECT_EQ(Last().status.code(), absl::StatusCode::kDeadlineExceeded);
}

// A bug that misuses the pool (simulated: an unref nobody owed) is caught after the step: the
// step's requests fail with Internal, queued ones with Unavailable, new ones are refused, and
// health() says why. Nothing crashes and the pool is not corrupted further.
TEST_F(EngineCoreSafetyTest, PoolMisuseStopsServingAndIsReported) {
  Init(/*blocks=*/40, /*max_batch_tokens=*/64, {.max_running = 1});
  Add(Request({0}, CacheMode::kLazy, 50));
  Add(Request({1}, CacheMode::kLazy, 50));
  core_->Step(MonotonicNow());
  ASSERT_TRUE(core_->health().ok());
  BlockId unreferenced = 0;
  while (core_->cache().pool().ref_count(unreferenced) > 0) ++unreferenced;
  core_->cache().pool().Unref(unreferenced);
  core_->Step(MonotonicNow());
  EXPECT_EQ(core_->health().code(), absl::StatusCode::kInternal);
  EXPECT_NE(core_->health().message().find("unref"), std::string::npos) << core_->health();
  EXPECT_EQ(outcomes_[keys_[0]].status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(outcomes_[keys_[1]].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(core_->stats().pool_errors, 1);
  EXPECT_FALSE(core_->HasWork());
  Add(Request({0}, CacheMode::kLazy));
  EXPECT_EQ(Last().status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Last().calls, 1);
}

// Engine::SubmitPrepared bounds the queue: past max_waiting_requests it answers
// ResourceExhausted at once, and a request arriving at an empty queue is always taken.
TEST_F(EngineCoreSafetyTest, EngineQueueIsBounded) {
  Engine engine(weights_.get(), tokenizer_.get(),
                {.num_kv_blocks = 256, .max_running = 1, .max_waiting_requests = 1});
  absl::Notification first_token, first_done;
  auto submit = [&](int max_tokens) {
    EngineRequest r = Request({0}, CacheMode::kLazy, max_tokens);
    return engine.Submit(
        r, {.on_token = [&](int32_t, std::string_view) {
              if (!first_token.HasBeenNotified()) first_token.Notify();
            },
            .on_done = [&](const absl::Status&, const RequestResult&) {
              if (!first_done.HasBeenNotified()) first_done.Notify();
            }});
  };
  auto a = submit(3000);  // generates for long enough (the pool holds its 3,000 tokens)
  ASSERT_TRUE(a.ok()) << a.status();
  first_token.WaitForNotification();
  ASSERT_FALSE(first_done.HasBeenNotified());
  auto b = submit(4);  // waits behind a (max_running 1)
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<uint64_t> c;
  for (int i = 0; i < 2000; ++i) {  // until b is counted as waiting
    c = submit(4);
    if (!c.ok()) break;
    engine.Cancel(*c);
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("engine.max_waiting_requests"), std::string::npos)
      << c.status();
  engine.Cancel(*a);
  engine.Cancel(*b);
  EXPECT_TRUE(engine.WaitIdleAndCheck().ok());
  EXPECT_TRUE(engine.health().ok());
}

}  // namespace
}  // namespace lazyattn
