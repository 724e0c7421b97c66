// The threaded engine: many submitting threads, streaming, cancellation, shutdown.
#include "services/worker/engine/engine.h"

#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  EngineTest() : weights_(MakeRandomWeights(TinyTestConfig(), 5)), tokenizer_(MakeByteTokenizer()) {}
  EngineRequest Request(int i, int max_tokens) {
    EngineRequest r;
    r.system_prefix = "system: be brief\n";
    for (int d = 0; d < 3; ++d) {
      r.documents.push_back({.text = "document number " + std::to_string((i + d) % 6) +
                                     " says something about topic " + std::to_string(d)});
    }
    r.question = "question " + std::to_string(i);
    r.mode = static_cast<CacheMode>(i % 4);
    r.sampling = {.temperature = 0.7f, .seed = static_cast<uint64_t>(i), .max_tokens = max_tokens,
                  .ignore_eos = true};
    return r;
  }
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(EngineTest, ManyThreadsSubmitAndEveryRequestEnds) {
  Engine engine(weights_.get(), tokenizer_.get(), {.num_kv_blocks = 60, .max_batch_tokens = 48});
  constexpr int kThreads = 6, kPerThread = 5;
  std::atomic<int> ok{0}, failed{0}, tokens{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        absl::Notification done;
        RequestCallbacks cb;
        cb.on_token = [&](int32_t, std::string_view) { ++tokens; };
        cb.on_done = [&](const absl::Status& s, const RequestResult& r) {
          (s.ok() && r.token_ids.size() == 12u ? ok : failed)++;
          done.Notify();
        };
        auto id = engine.Submit(Request(t * kPerThread + k, 12), std::move(cb));
        ASSERT_TRUE(id.ok()) << id.status();
        done.WaitForNotification();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GE(tokens.load(), kThreads * kPerThread * 12);
  EXPECT_TRUE(engine.WaitIdleAndCheck().ok()) << engine.WaitIdleAndCheck();
  EXPECT_EQ(engine.blocks().referenced, 0);
  EXPECT_EQ(engine.stats().requests_ok, kThreads * kPerThread);
}

TEST_F(EngineTest, CancelFromAnotherThreadEndsTheStream) {
  Engine engine(weights_.get(), tokenizer_.get(), {.num_kv_blocks = 200});
  absl::Notification first_token, done;
  absl::Status status;
  RequestCallbacks cb;
  cb.on_token = [&](int32_t, std::string_view) {
    if (!first_token.HasBeenNotified()) first_token.Notify();
  };
  cb.on_done = [&](const absl::Status& s, const RequestResult&) {
    status = s;
    done.Notify();
  };
  auto id = engine.Submit(Request(1, 3000), std::move(cb));
  ASSERT_TRUE(id.ok());
  first_token.WaitForNotification();
  engine.Cancel(*id);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(engine.WaitIdleAndCheck().ok());
  EXPECT_EQ(engine.blocks().referenced, 0);
}

TEST_F(EngineTest, InvalidRequestFailsAtSubmitAndShutdownEndsTheRest) {
  auto engine = std::make_unique<Engine>(weights_.get(), tokenizer_.get(),
                                         EngineOptions{.num_kv_blocks = 1000});
  EngineRequest bad = Request(0, 4);
  bad.sampling.temperature = -1;
  bool called = false;
  RequestCallbacks cb;
  cb.on_done = [&](const absl::Status&, const RequestResult&) { called = true; };
  EXPECT_EQ(engine->Submit(bad, cb).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(called);
  std::atomic<int> unavailable{0}, finished{0}, started{0};
  absl::Notification all_started;
  for (int i = 0; i < 4; ++i) {
    RequestCallbacks c;
    auto first = std::make_shared<std::atomic<bool>>(false);
    c.on_token = [&, first](int32_t, std::string_view) {
      if (!first->exchange(true) && ++started == 4) all_started.Notify();
    };
    c.on_done = [&](const absl::Status& s, const RequestResult&) {
      ++finished;
      if (s.code() == absl::StatusCode::kUnavailable) ++unavailable;
    };
    ASSERT_TRUE(engine->Submit(Request(i, 3000), c).ok());
  }
  // All four are generating inside the engine when it shuts down.
  ASSERT_TRUE(all_started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  engine.reset();
  EXPECT_EQ(finished.load(), 4);
  EXPECT_EQ(unavailable.load(), 4);
}

TEST_F(EngineTest, CacheEventsMatchTheSnapshotAndLoadDrainsToZero) {
  Engine engine(weights_.get(), tokenizer_.get(), {.num_kv_blocks = 200});
  EXPECT_EQ(engine.blocks().total, 200);  // known before the first step
  EXPECT_EQ(engine.blocks().free, 200);
  std::mutex mu;
  std::vector<CacheEvent> events;
  engine.set_cache_listener([&](const CacheEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  });
  EngineRequest r = Request(0, 4);
  r.mode = CacheMode::kLazy;
  auto result = engine.Run(r);
  ASSERT_TRUE(result.ok()) << result.status();
  int64_t doc_tokens = 0;
  for (const EngineDocument& d : r.documents) {
    doc_tokens += static_cast<int64_t>(tokenizer_->Encode(d.text, false).size());
  }
  EXPECT_EQ(result->usage.document_tokens, doc_tokens);
  EXPECT_EQ(result->usage.document_cached_tokens, 0);
  auto again = engine.Run(r);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->usage.document_cached_tokens, again->usage.document_tokens);

  const CacheSnapshot snap = engine.CachedDocuments();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(events.size(), 3u);  // three documents stored once, nothing evicted
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_TRUE(events[i].stored);
    EXPECT_EQ(events[i].version, i + 1);
    EXPECT_EQ(events[i].key.offset, DocCacheKey::kAnyOffset);
  }
  EXPECT_EQ(snap.version, 3u);
  EXPECT_EQ(snap.documents.size(), 3u);
  EXPECT_TRUE(engine.WaitIdleAndCheck().ok());
  const EngineLoad load = engine.load();
  EXPECT_EQ(load.running, 0);
  EXPECT_EQ(load.waiting, 0);
  EXPECT_EQ(load.queued_prefill_tokens, 0);
}

TEST(KvBlocksForBudgetTest, CountsFp32KeysAndValuesOfEveryLayer) {
  // Tiny config: 2 layers x (2 kv heads x 16 dims) x K and V x 4 bytes x 16 tokens = 8 KiB.
  EXPECT_EQ(KvBlocksForBudget(TinyTestConfig(), 8192 * 10), 10);
  EXPECT_EQ(KvBlocksForBudget(TinyTestConfig(), 100), 1);  // at least one
}

TEST(KvBlocksForBudgetTest, F16HoldsTwiceTheBlocksOfF32) {
  // 2 bytes a value: a block is 4 KiB.
  EXPECT_EQ(KvBlocksForBudget(TinyTestConfig(), 8192 * 10, KvCacheDtype::kF16), 20);
  EXPECT_EQ(KvBlocksForBudget(TinyTestConfig(), 8192 * 10, KvCacheDtype::kF32), 10);
  EXPECT_EQ(KvBlocksForBudget(TinyTestConfig(), 4095, KvCacheDtype::kF16), 1);
  EXPECT_EQ(KvBlocksForBudget(TinyTestConfig(), 4096 * 3 - 1, KvCacheDtype::kF16), 2);
}

TEST(KvCacheCpuTest, PoolsAndBytesPerTokenFollowTheDtype) {
  KvCacheCpu f16(TinyTestConfig(), 3, kDefaultKvBlockSize, KvCacheDtype::kF16);
  KvCacheCpu f32(TinyTestConfig(), 3, kDefaultKvBlockSize, KvCacheDtype::kF32);
  // 2 layers x 2 kv heads x 16 dims x K and V.
  EXPECT_EQ(f16.bytes_per_token(), 128 * 2);
  EXPECT_EQ(f32.bytes_per_token(), 128 * 4);
  for (int l = 0; l < 2; ++l) {
    EXPECT_NE(f16.k_f16(l), nullptr);
    EXPECT_NE(f16.v_f16(l), nullptr);
    EXPECT_EQ(f16.k(l), nullptr);
    EXPECT_NE(f32.k(l), nullptr);
    EXPECT_EQ(f32.v_f16(l), nullptr);
  }
  // Without an explicit type the pool takes the process-wide one.
  SetCpuKvCacheDtype(KvCacheDtype::kF32);
  EXPECT_EQ(KvCacheCpu(TinyTestConfig(), 1).dtype(), KvCacheDtype::kF32);
  SetCpuKvCacheDtype(KvCacheDtype::kF16);
  EXPECT_EQ(KvCacheCpu(TinyTestConfig(), 1).dtype(), KvCacheDtype::kF16);
}

TEST(KvCacheCpuTest, DtypeNamesParseBackAndOthersAreRefused) {
  for (KvCacheDtype d : {KvCacheDtype::kF16, KvCacheDtype::kF32}) {
    KvCacheDtype parsed = d == KvCacheDtype::kF16 ? KvCacheDtype::kF32 : KvCacheDtype::kF16;
    ASSERT_TRUE(ParseKvCacheDtype(KvCacheDtypeName(d), &parsed));
    EXPECT_EQ(parsed, d);
  }
  KvCacheDtype out = KvCacheDtype::kF32;
  for (const char* bad : {"", "F16", "fp16", "bf16", "f8", "f16 "}) {
    EXPECT_FALSE(ParseKvCacheDtype(bad, &out)) << bad;
  }
  EXPECT_EQ(out, KvCacheDtype::kF32);
}

}  // namespace
}  // namespace lazyattn
