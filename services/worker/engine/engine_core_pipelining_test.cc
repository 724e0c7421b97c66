// Pipelined decode (ModelRunner::Launch/Collect) through the engine core, on a CPU runner that
// pipelines as the CUDA runner does: the same tokens as step-by-step decode.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "common/monotonic_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/engine_core_test_fixture.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/pipelining_cpu_runner_for_test.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

using engine_core_testing::EngineCoreTest;
using engine_core_testing::Outcome;
using testing::PipeliningCpuRunner;

// Pipelined decode (EngineOptions::pipeline_decode) generates what step-by-step decode does, in
// the modes with documents: requests that finish at different steps (by length while the next
// step is in flight, or on a stop token, whose row of the chained step is dropped), one that joins
// mid-run, one cancelled mid-run, chained launches that fail (the engine falls back to an
// ordinary step). The pool's invariant holds afterwards.
TEST_F(EngineCoreTest, PipelinedDecodeMatchesStepByStepDecode) {
  struct Result {
    absl::Status status;
    RequestResult result;
  };
  const std::vector<int> max_tokens = {3, 9, 20, 20, 26, 30};
  constexpr size_t kJoiner = 5, kCancelled = 4, kStopped = 2;
  auto run = [&](CacheMode mode, bool pipeline, int fail_every, int32_t stop_token, int* chained) {
    auto runner = std::make_unique<PipeliningCpuRunner>(weights_.get(), 512, fail_every);
    PipeliningCpuRunner* raw = runner.get();
    EngineCore core(std::move(runner), tokenizer_.get(),
                    {.max_batch_tokens = 512, .pipeline_decode = pipeline});
    std::vector<Result> out(max_tokens.size());
    std::vector<uint64_t> ids(max_tokens.size());
    auto add = [&](size_t i) {
      EngineRequest r =
          Request({static_cast<int>(i % 3), static_cast<int>(3 + i % 2)}, mode, max_tokens[i]);
      if (i == kStopped && stop_token >= 0) r.sampling.stop_token_ids = {stop_token};
      auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
      EXPECT_TRUE(p.ok()) << p.status();
      p->callbacks.on_done = [&out, i](const absl::Status& st, const RequestResult& res) {
        out[i] = {st, res};
      };
      ids[i] = core.Add(std::move(*p));
    };
    for (size_t i = 0; i < max_tokens.size(); ++i) {
      if (i != kJoiner) add(i);
    }
    for (int step = 0; core.HasWork() && step < 10000; ++step) {
      if (step == 6) add(kJoiner);
      if (step == 12) core.Cancel(ids[kCancelled]);
      core.Step(MonotonicNow());
    }
    EXPECT_FALSE(core.HasWork()) << "the engine did not drain";
    EXPECT_TRUE(core.cache().CheckInvariant().ok()) << core.cache().CheckInvariant();
    *chained = raw->chained();
    return out;
  };
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock}) {
    SCOPED_TRACE(::testing::Message() << "mode " << CacheModeName(mode));
    int chained = 0;
    // Request kStopped's 6th token, from a run without stop tokens, becomes its stop token.
    const std::vector<Result> plain = run(mode, false, 0, -1, &chained);
    ASSERT_TRUE(plain[kStopped].status.ok()) << plain[kStopped].status;
    ASSERT_GE(plain[kStopped].result.token_ids.size(), 6u);
    const int32_t stop = plain[kStopped].result.token_ids[5];
    const std::vector<Result> want = run(mode, false, 0, stop, &chained);
    EXPECT_EQ(chained, 0);
    EXPECT_EQ(want[kStopped].result.finish_reason, "stop");
    EXPECT_EQ(want[kCancelled].status.code(), absl::StatusCode::kCancelled);
    for (int fail_every : {0, 5}) {
      SCOPED_TRACE(::testing::Message() << "fail_every " << fail_every);
      const std::vector<Result> got = run(mode, true, fail_every, stop, &chained);
      EXPECT_GT(chained, 10) << "no step was chained";
      for (size_t i = 0; i < max_tokens.size(); ++i) {
        SCOPED_TRACE(::testing::Message() << "request " << i);
        EXPECT_EQ(got[i].status.code(), want[i].status.code()) << got[i].status;
        EXPECT_EQ(got[i].result.finish_reason, want[i].result.finish_reason);
        // Where a cancellation lands depends on the step it meets.
        if (i != kCancelled) {
          EXPECT_EQ(got[i].result.token_ids, want[i].result.token_ids);
        }
      }
    }
  }
}

// A request that wants top_logprobs brings its rows' logits back every step, and its steps stay
// pipelined: the lists of chained steps are those of step-by-step decode, beside a request that
// asked for none. The second run draws with penalties: in a chained step the runner counts the
// input token it drew itself (kCountInputToken) and the host ranks with a history that holds it,
// so both must agree for the lists to match. The third adds a logit bias, which chained steps
// must carry on as the first step of each request had it.
TEST_F(EngineCoreTest, TopLogprobsStayPipelined) {
  std::vector<int32_t> question;  // request 0's
  SamplingParams sampling0;
  auto run = [&](bool pipeline, bool penalties, bool bias, int* chained,
                 std::vector<std::vector<float>>* rows) {
    auto runner = std::make_unique<PipeliningCpuRunner>(weights_.get(), 512, /*fail_every=*/0);
    PipeliningCpuRunner* raw = runner.get();
    EngineCore core(std::move(runner), tokenizer_.get(),
                    {.max_batch_tokens = 512, .pipeline_decode = pipeline});
    std::vector<RequestResult> out(2);
    for (int i = 0; i < 2; ++i) {
      EngineRequest r = Request({i, 3}, CacheMode::kLazy, 16);
      r.sampling.logprobs = true;
      r.sampling.top_logprobs = i == 0 ? kMaxTopLogprobs : 0;
      if (penalties) {
        r.sampling.temperature = 0.7f;
        r.sampling.seed = 3 + i;
        r.sampling.repetition_penalty = 1.4f;
        r.sampling.frequency_penalty = 1.0f;
        r.sampling.presence_penalty = 0.5f;
      }
      if (bias) r.sampling.logit_bias = {{3, 2.0f}, {17, -1.5f}, {40 + i, 4.0f}};
      auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
      EXPECT_TRUE(p.ok()) << p.status();
      if (i == 0) question = p->question, sampling0 = r.sampling;
      p->callbacks.on_done = [&out, i](const absl::Status& st, const RequestResult& res) {
        EXPECT_TRUE(st.ok()) << st;
        out[i] = res;
      };
      core.Add(std::move(*p));
    }
    for (int step = 0; core.HasWork() && step < 1000; ++step) core.Step(MonotonicNow());
    EXPECT_FALSE(core.HasWork());
    *chained = raw->chained();
    *rows = raw->returned_rows();  // request 0's only: the other asks for no alternatives
    return out;
  };
  // Request 0's lists against a log_softmax in double of each returned row, penalized here with
  // the history that position's draw saw: the question, then the tokens before it.
  auto expect_reference = [&](const RequestResult& res,
                              const std::vector<std::vector<float>>& rows) {
    ASSERT_EQ(rows.size(), res.token_ids.size());
    for (size_t t = 0; t < rows.size(); ++t) {
      std::vector<int32_t> history = question;
      history.insert(history.end(), res.token_ids.begin(), res.token_ids.begin() + t);
      const SamplingRowParams row = RowSamplingParams(sampling0, t);
      std::vector<double> x(rows[t].begin(), rows[t].end());
      for (const PenaltyEntry& e :
           RowAdjustments(row, PenaltyEntries(history, question.size()), sampling0.logit_bias)) {
        x[e.id] = PenalizedLogit(rows[t][e.id], row, e);
      }
      const double mx = *std::max_element(x.begin(), x.end());
      double z = 0;
      for (double v : x) z += std::exp(v - mx);
      std::vector<int32_t> order(x.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return x[a] > x[b]; });
      for (size_t i = 0; i < res.top_logprobs[t].size(); ++i) {
        EXPECT_EQ(res.top_logprobs[t][i].token_id, order[i]) << "token " << t << " entry " << i;
        EXPECT_NEAR(res.top_logprobs[t][i].logprob, x[order[i]] - mx - std::log(z), 1e-4)
            << "token " << t << " entry " << i;
      }
    }
  };
  for (int mode = 0; mode < 3; ++mode) {
    const bool penalties = mode >= 1, bias = mode == 2;
    SCOPED_TRACE(::testing::Message() << "penalties " << penalties << " bias " << bias);
    int chained = 0;
    std::vector<std::vector<float>> want_rows, got_rows;
    const std::vector<RequestResult> want = run(false, penalties, bias, &chained, &want_rows);
    const std::vector<RequestResult> got = run(true, penalties, bias, &chained, &got_rows);
    EXPECT_GT(chained, 5) << "no step was chained";
    expect_reference(want[0], want_rows);
    expect_reference(got[0], got_rows);
    ASSERT_EQ(want[0].top_logprobs.size(), 16u);
    EXPECT_TRUE(want[1].top_logprobs.empty());
    EXPECT_TRUE(got[1].top_logprobs.empty());
    EXPECT_EQ(got[0].token_ids, want[0].token_ids);
    EXPECT_EQ(got[1].token_ids, want[1].token_ids);
    ASSERT_EQ(got[0].top_logprobs.size(), want[0].top_logprobs.size());
    int drawn_in_list = 0;
    for (size_t t = 0; t < want[0].top_logprobs.size(); ++t) {
      ASSERT_EQ(got[0].top_logprobs[t].size(), size_t(kMaxTopLogprobs)) << "token " << t;
      for (size_t i = 0; i < size_t(kMaxTopLogprobs); ++i) {
        EXPECT_EQ(got[0].top_logprobs[t][i].token_id, want[0].top_logprobs[t][i].token_id);
        EXPECT_NEAR(got[0].top_logprobs[t][i].logprob, want[0].top_logprobs[t][i].logprob, 1e-5);
        if (got[0].top_logprobs[t][i].token_id == got[0].token_ids[t]) {
          EXPECT_EQ(got[0].top_logprobs[t][i].logprob, got[0].logprobs[t]);
          ++drawn_in_list;
        }
      }
      // Greedy: the drawn token heads its list.
      if (!penalties) {
        EXPECT_EQ(got[0].top_logprobs[t][0].token_id, got[0].token_ids[t]);
      }
    }
    EXPECT_GT(drawn_in_list, 0);
  }
}

// A pipelined step whose Collect fails, with the step chained to it already launched: the
// chained step is read and dropped (its input tokens were the failed step's), the failed step's
// requests run alone and then together again, and every request generates what it does without
// the fault, sampled ones too (a retried step draws with the same draw number). The steps run
// alone are not pipelined: Forward, one chunk each, until the requests batch again.
TEST_F(EngineCoreTest, AFailedPipelinedStepDropsTheStepChainedToIt) {
  auto run = [&](int fail_collect_at, bool* chained_in_flight, int64_t* isolated) {
    auto runner = std::make_unique<PipeliningCpuRunner>(weights_.get(), 512, /*fail_every=*/0);
    PipeliningCpuRunner* raw = runner.get();
    raw->fail_collect_at = fail_collect_at;
    EngineCore core(std::move(runner), tokenizer_.get(), {.max_batch_tokens = 512});
    std::vector<Outcome> out(3);
    for (int i = 0; i < 3; ++i) {
      EngineRequest r = Request({i, 3}, CacheMode::kLazy, 12);
      if (i == 1)
        r.sampling = {.temperature = 0.8f, .seed = 7, .max_tokens = 12, .ignore_eos = true};
      auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
      EXPECT_TRUE(p.ok()) << p.status();
      p->callbacks.on_done = [&out, i](const absl::Status& st, const RequestResult& res) {
        out[i] = {st, res};
      };
      core.Add(std::move(*p));
    }
    for (int step = 0; core.HasWork() && step < 10000; ++step) core.Step(MonotonicNow());
    EXPECT_FALSE(core.HasWork()) << "the engine did not drain";
    EXPECT_TRUE(core.cache().CheckInvariant().ok()) << core.cache().CheckInvariant();
    *chained_in_flight = raw->failed_with_chained_in_flight;
    *isolated = core.stats().steps_isolated;
    // The first step after the failed Collect runs a suspect alone, by Forward (not launched).
    const auto failed = std::find(raw->calls.begin(), raw->calls.end(), "C!");
    if (fail_collect_at > 0) {
      EXPECT_NE(failed, raw->calls.end());
      if (failed != raw->calls.end() && failed + 1 != raw->calls.end()) {
        EXPECT_EQ(failed[1], "F1") << "the first step alone after the failure";
      } else {
        ADD_FAILURE() << "no step after the failed Collect";
      }
    }
    return out;
  };
  bool chained_in_flight = false;
  int64_t isolated = 0;
  const std::vector<Outcome> want = run(0, &chained_in_flight, &isolated);
  int with_chained_step = 0;
  for (int fail_at = 1; fail_at <= 8; ++fail_at) {
    SCOPED_TRACE(::testing::Message() << "failing collect " << fail_at);
    const std::vector<Outcome> got = run(fail_at, &chained_in_flight, &isolated);
    EXPECT_EQ(isolated, 1);
    with_chained_step += chained_in_flight;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i].status.ok()) << "request " << i << ": " << got[i].status;
      EXPECT_EQ(got[i].result.token_ids, want[i].result.token_ids) << "request " << i;
    }
  }
  EXPECT_GT(with_chained_step, 0) << "no failure met a chained step in flight";
}

}  // namespace
}  // namespace lazyattn
