// The CUDA backend under the engine: pipelined decode against step-by-step decode, and SmolLM2's
// golden prompts against the CPU backend (fp32, itself checked against llama.cpp). Runs on the
// GPU machine (tests/gpu/run.sh); skips without a GPU.
//
// Metric for logits (bf16 weights and activations vs fp32): rel_err = max |ours - ref| / std(ref)
// over the whole vocabulary, and the cosine of the two rows. Thresholds are stated per test.
#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "nlohmann/json.hpp"
#include "services/worker/cuda/cuda_backend_test_util.h"
#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/engine/top_logprobs.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

// The CPU backend's next-token logits after `prompt` and then `generated` (the engine keeps the
// first step's logits; the prompt is tokenized as the engine tokenizes a question).
std::vector<float> CpuLogitsAfter(Engine& cpu, const Tokenizer& tok, const std::string& prompt,
                                  std::span<const int32_t> generated) {
  std::vector<int32_t> ids = tok.Encode(prompt, /*parse_special=*/true);
  ids.insert(ids.end(), generated.begin(), generated.end());
  auto r = cpu.Run({.question_token_ids = ids,
                    .mode = CacheMode::kFull,
                    .sampling = {.max_tokens = 1, .ignore_eos = true}});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->first_logits : std::vector<float>{};
}

// SmolLM2-135M-Instruct (Q4_1, dequantized then rounded to bf16): the golden prompts of
// tests/data/generation_golden.json, greedy, in mode full. The CPU backend reproduces llama.cpp's
// 32 tokens exactly (tests/golden). Here:
// - first-step logits: cosine >= 0.999 and rel_err (max |error| / std of the logits) < 0.25.
//   HF transformers' own bf16 run of this GGUF errs by 0.082-0.217 against its fp32 run on
//   these prompts, ours by 0.037-0.152 (H200, 2026-11-29; tests/gpu/hf_gguf_check.py, which
//   bounds ours per prompt by twice HF's). The worst prompt (question/chat) measured 0.152 on
//   one machine and 0.202 in two runs on another, with kernels whose arithmetic is unchanged
//   (their PTX compared); the likely cause is the summation order of the GEMM algorithms
//   cuBLASLt's autotuner picks on each machine, which a maximum over 49K logits after 30 layers
//   of bf16 rounding magnifies. bf16 weights alone account for at most 0.048 (the CPU backend
//   over bf16-rounded weights): the rest is bf16 activations and KV. A different first token is
//   judged like any other parting, below;
// - greedy tokens: the first 16 identical to the CPU backend's, except that a continuation may
//   part at a near-tie of the fp32 CPU model, the rule vLLM compares two precisions by
//   (check_logprobs_close: each side's token among the other's top 5): where they part, the
//   GPU's token must be among the CPU's top 5 there, behind the CPU's own token by less than the
//   largest first-step logit error of that prompt (the bf16 pipeline's own noise, measured on the
//   same prompt). Strict agreement is counted and printed.
// Pipelined decode (EngineOptions::pipeline_decode: step N+1 launched before step N's tokens
// reach the host, its input tokens taken on the device) generates exactly what step-by-step
// decode does: the same greedy tokens and finish reasons for requests that finish at different
// steps (while the next step is in flight), one that joins mid-run and one cancelled mid-run;
// and it did pipeline. The block pool is consistent afterwards.
// Exact equality needs both runs to give each step the same rows: a request the launched step
// finishes by max_tokens is left out of the chained step after it, as the unpipelined engine
// leaves it out, so it does. (One that stopped on a stop token would be a dropped row there;
// with ignore_eos none does.)
// `sampled`: odd requests sample (T 0.8, top-p 0.95, a seed each; request 3 with min-p and
// request 7 with repetition/frequency/presence penalties and a logit bias, whose chained steps
// count the token drawn on the device), even ones stay greedy (request 4 with a logit bias, so
// it leaves the greedy argmax for the sampler): mixed batches, each draw a function of (seed,
// step, logits), so both runs must still agree token for token.
// The runner of `inner`, except that the Collect of every `fail_every`-th launched step of two
// rows or more answers a failure after the step ran: its draws lost between the device and the
// host, a chained step possibly launched behind it. (A failed step of one row ends its request.)
class CollectFailingRunner final : public ForwardingModelRunner {
 public:
  CollectFailingRunner(std::unique_ptr<ModelRunner> inner, int fail_every)
      : ForwardingModelRunner(std::move(inner)), fail_every_(fail_every) {}
  absl::Status Launch(std::span<const ForwardChunk> chunks,
                      std::span<const int32_t> previous_step_rows) override {
    absl::Status launched = inner().Launch(chunks, previous_step_rows);
    if (launched.ok()) rows_.push_back(chunks.size());
    return launched;
  }
  absl::StatusOr<ForwardOutput> Collect() override {
    absl::StatusOr<ForwardOutput> out = inner().Collect();
    const size_t rows = rows_.empty() ? 0 : rows_.front();
    if (!rows_.empty()) rows_.pop_front();
    if (out.ok() && rows >= 2 && ++multi_row_collects_ % fail_every_ == 0) {
      return absl::InternalError("injected collect failure");
    }
    return out;
  }

 private:
  int fail_every_;
  std::deque<size_t> rows_;  // of each launched, uncollected step
  int multi_row_collects_ = 0;
};

// With `fail_every_collect` N > 0 (greedy only), every N-th pipelined step of several rows fails
// at its Collect (CollectFailingRunner): the engine drops the step chained to it and runs its
// requests alone, under fresh block tables (the device's table store holds versions no step
// used). A row computed alone may round differently from the same row in a batch (other kernels:
// the fused one-row products, another split of the attention), so the tokens must agree with
// step-by-step decode until they part at a near-tie: there the reference's token is among the
// run's 5 most likely, within 0.05 of its best logprob (a wrong table reads other KV and parts
// far from any tie). Every request asks for its 5 alternatives for this.
void CheckPipelinedDecode(bool sampled, int fail_every_collect = 0) {
  const ModelConfig c = SmallConfig();
  const auto weights = HfLikeWeights(c, 11);
  const auto tokenizer = MakeByteTokenizer();
  const ModelIdentity identity{ModelFingerprint(*weights), TokenizerFingerprint(*tokenizer)};
  struct Outcome {
    absl::Status status;
    RequestResult result;
  };
  // Request i finishes at step max_tokens[i] - 1 (the prefill, step 0, gives its first token);
  // the joiner's prefill is step 6, and the last two requests decode alone at the end.
  const std::vector<int> max_tokens = {6, 9, 30, 30, 30, 30, 35, 40};
  constexpr size_t kJoiner = 7, kCancelled = 5;
  int64_t isolated = 0;
  auto run = [&](bool pipeline, int64_t* chained) {
    auto gpu = CudaModelWeights::Upload(*weights);
    EXPECT_TRUE(gpu.ok()) << gpu.status();
    auto runner = CudaModelRunner::Create(std::move(*gpu), {.num_kv_blocks = 512});
    EXPECT_TRUE(runner.ok()) << runner.status();
    CudaModelRunner* raw = runner->get();
    std::unique_ptr<ModelRunner> engine_runner = std::move(*runner);
    if (pipeline && fail_every_collect > 0) {
      engine_runner =
          std::make_unique<CollectFailingRunner>(std::move(engine_runner), fail_every_collect);
    }
    EngineCore core(std::move(engine_runner), tokenizer.get(),
                    {.max_batch_tokens = 256, .pipeline_decode = pipeline});
    std::vector<Outcome> out(max_tokens.size());
    std::vector<uint64_t> ids(max_tokens.size());
    auto add = [&](size_t i) {
      EngineRequest r{.mode = CacheMode::kFull,
                      .sampling = {.max_tokens = max_tokens[i], .ignore_eos = true}};
      if (sampled && i % 2 == 1) {
        r.sampling.temperature = 0.8f;
        r.sampling.top_p = 0.95f;
        r.sampling.seed = 7 + i;
        if (i == 3) r.sampling.min_p = 0.05f;
        if (i == 1 || i == 3 || i == 7) {  // their rows bring logits back each step, pipelined
          r.sampling.logprobs = true;
          r.sampling.top_logprobs = 5;
        }
        if (i == 7) {
          r.sampling.repetition_penalty = 1.3f;
          r.sampling.frequency_penalty = 0.4f;
          r.sampling.presence_penalty = 0.3f;
          r.sampling.logit_bias = {{5, 2.0f}, {97, -1.0f}, {200, 1.5f}};
        }
      }
      if (sampled && i == 4) r.sampling.logit_bias = {{12, 3.0f}, {100, -100.0f}};
      if (fail_every_collect > 0) {
        r.sampling.logprobs = true;
        r.sampling.top_logprobs = 5;
      }
      // A greedy row with alternatives too: rows 1-3 come back as one run of consecutive rows
      // (after row 0, which does not), and the runs change as requests finish.
      if (sampled && i == 2) {
        r.sampling.logprobs = true;
        r.sampling.top_logprobs = 5;
      }
      std::mt19937 rng(100 + i);
      std::vector<int> question(5 + 7 * i);
      for (int& t : question) t = static_cast<int>(rng() % 256);
      r.question_token_ids = std::move(question);
      auto p = PrepareRequest(r, *tokenizer, c, identity, {});
      EXPECT_TRUE(p.ok()) << p.status();
      p->callbacks.on_done = [&out, i](const absl::Status& s, const RequestResult& res) {
        out[i] = {s, res};
      };
      ids[i] = core.Add(std::move(*p));
    };
    for (size_t i = 0; i < max_tokens.size(); ++i) {
      if (i != kJoiner) add(i);
    }
    for (int step = 0; core.HasWork() && step < 10000; ++step) {
      if (step == 6) add(kJoiner);
      if (step == 14) core.Cancel(ids[kCancelled]);
      core.Step(MonotonicNow());
    }
    EXPECT_FALSE(core.HasWork()) << "the engine did not drain";
    EXPECT_TRUE(core.cache().CheckInvariant().ok()) << core.cache().CheckInvariant();
    *chained = raw->chained_launches();
    if (pipeline) isolated = core.stats().steps_isolated;
    return out;
  };
  int64_t chained_off = 0, chained_on = 0;
  const std::vector<Outcome> want = run(false, &chained_off);
  const std::vector<Outcome> got = run(true, &chained_on);
  EXPECT_EQ(chained_off, 0);
  EXPECT_GT(chained_on, 10) << "pipelined decode never chained a step";
  if (fail_every_collect > 0) {
    EXPECT_GT(isolated, 2) << "too few failed steps were isolated";
    for (size_t i = 0; i < max_tokens.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "request " << i);
      EXPECT_EQ(got[i].status.code(), want[i].status.code()) << got[i].status;
      if (i == kCancelled) continue;
      ASSERT_EQ(got[i].result.token_ids.size(), static_cast<size_t>(max_tokens[i]));
      ASSERT_EQ(got[i].result.top_logprobs.size(), got[i].result.token_ids.size());
      for (size_t t = 0; t < got[i].result.token_ids.size(); ++t) {
        if (got[i].result.token_ids[t] == want[i].result.token_ids[t]) continue;
        const std::vector<TopLogprob>& alternatives = got[i].result.top_logprobs[t];
        const auto ref = std::find_if(
            alternatives.begin(), alternatives.end(),
            [&](const TopLogprob& a) { return a.token_id == want[i].result.token_ids[t]; });
        ASSERT_NE(ref, alternatives.end()) << "parted at token " << t << " far from a tie";
        EXPECT_LT(alternatives[0].logprob - ref->logprob, 0.05f) << "parted at token " << t;
        break;  // the continuations differ from here on
      }
    }
    return;
  }
  for (size_t i = 0; i < max_tokens.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    EXPECT_EQ(got[i].status.code(), want[i].status.code()) << got[i].status;
    EXPECT_EQ(got[i].result.finish_reason, want[i].result.finish_reason);
    if (i == kCancelled) {
      EXPECT_EQ(want[i].status.code(), absl::StatusCode::kCancelled);
      continue;  // where a cancellation lands depends on the step it meets
    }
    ASSERT_TRUE(want[i].status.ok()) << want[i].status;
    EXPECT_EQ(want[i].result.token_ids.size(), static_cast<size_t>(max_tokens[i]));
    EXPECT_EQ(got[i].result.token_ids, want[i].result.token_ids);
    // The alternatives of chained steps are those of step-by-step decode; the drawn token, when
    // among them, carries exactly its own logprob.
    ASSERT_EQ(got[i].result.top_logprobs.size(), want[i].result.top_logprobs.size());
    EXPECT_EQ(want[i].result.top_logprobs.size(), sampled && (i == 1 || i == 2 || i == 3 || i == 7)
                                                      ? want[i].result.token_ids.size()
                                                      : 0u);
    for (size_t t = 0; t < got[i].result.top_logprobs.size(); ++t) {
      const std::vector<TopLogprob>& g = got[i].result.top_logprobs[t];
      const std::vector<TopLogprob>& w = want[i].result.top_logprobs[t];
      ASSERT_EQ(g.size(), 5u) << "token " << t;
      ASSERT_EQ(w.size(), 5u) << "token " << t;
      for (size_t k = 0; k < g.size(); ++k) {
        EXPECT_EQ(g[k].token_id, w[k].token_id) << "token " << t << " entry " << k;
        EXPECT_NEAR(g[k].logprob, w[k].logprob, 1e-5) << "token " << t << " entry " << k;
        if (g[k].token_id == got[i].result.token_ids[t]) {
          EXPECT_EQ(g[k].logprob, got[i].result.logprobs[t]) << "token " << t;
        }
      }
    }
  }
}

TEST(CudaEngineTest, PipelinedDecodeGivesTheSameTokens) {
  SKIP_WITHOUT_GPU();
  CheckPipelinedDecode(false);
}

TEST(CudaEngineTest, PipelinedSampledDecodeGivesTheSameTokens) {
  SKIP_WITHOUT_GPU();
  CheckPipelinedDecode(true);
}

TEST(CudaEngineTest, FailedPipelinedStepsRunAloneToTheSameTokens) {
  SKIP_WITHOUT_GPU();
  CheckPipelinedDecode(false, /*fail_every_collect=*/4);
}

TEST(CudaBackendSmolLm2Test, GoldenPromptsMatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const char* path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " absent (tests/gpu/run.sh unpacks it when it was carried)";
  }
  auto model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  std::ifstream in("tests/data/generation_golden.json");
  const auto golden = nlohmann::json::parse(in);
  const std::string fp = ModelFingerprint(*model->weights);
  Engine cpu(model->weights.get(), model->tokenizer.get(),
             {.num_kv_blocks = 256, .keep_first_logits = true});
  // Prompts of up to 64 tokens run their products on the wgmma kernel by default; 0 gives the
  // cuBLASLt path that longer prompts take. Both must meet the bounds.
  for (int wgmma_max_rows : {0, 64}) {
    SCOPED_TRACE(::testing::Message() << "wgmma_max_rows " << wgmma_max_rows);
    Engine gpu(CudaRunnerFor(*model->weights, 256, wgmma_max_rows), fp, model->tokenizer.get(),
               {.keep_first_logits = true});
    int runs = 0, tokens_equal = 0, first16_equal = 0;
    double worst = 0, worst_cosine = 1;
    for (const auto& run : golden["runs"]) {
      const std::string name =
          run["name"].get<std::string>() + "/" + run["mode"].get<std::string>();
      SCOPED_TRACE(name);
      const std::string prompt = run["prompt_text"].get<std::string>();
      EngineRequest request{.question = prompt,
                            .mode = CacheMode::kFull,
                            .sampling = {.max_tokens = 32, .ignore_eos = true}};
      auto want = cpu.Run(request);
      auto got = gpu.Run(request);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_GE(got->token_ids.size(), 16u);
      ASSERT_GE(want->token_ids.size(), 16u);
      const auto d = CompareLogits(got->first_logits, want->first_logits);
      worst = std::max(worst, d.rel_err);
      worst_cosine = std::min(worst_cosine, d.cosine);
      EXPECT_GT(d.cosine, 0.999);
      EXPECT_LT(d.rel_err, 0.25);
      ++runs;
      tokens_equal += got->token_ids == want->token_ids;
      size_t part = 0;
      while (part < 16 && got->token_ids[part] == want->token_ids[part]) ++part;
      if (part == 16) {
        ++first16_equal;
        continue;
      }
      // They part at token `part`: the CPU's logits there, after the common prefix.
      const std::vector<float> cpu_logits =
          CpuLogitsAfter(cpu, *model->tokenizer, prompt, std::span(want->token_ids).first(part));
      ASSERT_FALSE(cpu_logits.empty());
      const int32_t cpu_token = want->token_ids[part], gpu_token = got->token_ids[part];
      ASSERT_EQ(std::max_element(cpu_logits.begin(), cpu_logits.end()) - cpu_logits.begin(),
                cpu_token)
          << "the CPU's logits after the prompt and common prefix do not reproduce its own token";
      int rank = 1;
      for (float l : cpu_logits) rank += l > cpu_logits[gpu_token];
      const double margin = double{cpu_logits[cpu_token]} - cpu_logits[gpu_token];
      std::cout << name << ": parts at token " << part << " (cpu " << cpu_token << ", cuda "
                << gpu_token << "): the CUDA token is the CPU's rank " << rank << " by " << margin
                << " logits; first-step max error " << d.max_abs << "\n";
      EXPECT_LE(rank, 5) << "parted at token " << part << " on a token outside the CPU's top 5";
      EXPECT_LT(margin, d.max_abs)
          << "parted at token " << part << " where the CPU was not near a tie";
    }
    EXPECT_GE(runs, 12);
    std::cout << "SmolLM2 cuda (wgmma_max_rows " << wgmma_max_rows << ") vs cpu: " << runs
              << " prompts, worst first-step rel_err " << worst << ", worst cosine " << worst_cosine
              << ", first 16 tokens equal in " << first16_equal << ", all 32 in " << tokens_equal
              << "\n";
  }
}

}  // namespace
}  // namespace lazyattn
