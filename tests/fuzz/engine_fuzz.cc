// Fuzzes EngineCore's scheduling (engine_core.h) with random mixes of requests, cancellations,
// deadlines, failed forward steps and a small KV pool (preemption and eviction pressure), through
// its public interface only. The model is a fake ModelRunner that computes nothing but checks the
// chunks it is handed; tokens are the byte tokenizer's.
//
// Checked on every input:
//  - after every Step, the KV cache invariant (KvCacheManager::CheckInvariant);
//  - every chunk passes ValidateForwardChunks (the engine never builds a chunk a backend refuses);
//  - no callback runs after on_done, and on_done runs at most once;
//  - after draining: every request got exactly one on_done, no block is still referenced, the core
//    has no work left.
// A violation traps, so libFuzzer (and the replay test) report it with the input.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/monotonic_time.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/model_runner.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

namespace lazyattn {
namespace {

using fuzz::FuzzInput;

#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) __builtin_trap(); \
  } while (0)

// Bounds that keep one input well under 100 ms.
constexpr int kMaxOps = 160;
constexpr int kNumDocuments = 4;
constexpr int kMaxDocumentBytes = 90;
constexpr int kMaxDrainSteps = 20000;

// Steps (counted over Forward, Launch, Collect and CopyBlocks calls) that fail with Internal, as
// a device failure would.
class FailureSchedule {
 public:
  void Add(int call) { failing_.insert(call); }
  bool NextFails() { return failing_.contains(calls_++); }

 private:
  absl::flat_hash_set<int> failing_;
  int calls_ = 0;
};

// A model runner with no model: logits are a deterministic function of each row's token and
// position, so sampling and stop handling see varied ids (EOS included); rows are drawn on the
// host as the CPU backend does. Optionally pipelines decode steps the way the CUDA backend does
// (Launch computes at once, Collect hands it back).
class FakeRunner final : public ModelRunner {
 public:
  FakeRunner(ModelConfig config, int64_t blocks, bool pipelined, uint8_t salt,
             FailureSchedule* failures)
      : config_(std::move(config)),
        blocks_(blocks),
        pipelined_(pipelined),
        salt_(salt),
        failures_(failures) {}

  const ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return "fuzz"; }
  int64_t num_kv_blocks() const override { return blocks_; }

  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    FUZZ_CHECK(ValidateForwardChunks(chunks, config_, blocks_).ok());
    if (failures_->NextFails()) return absl::InternalError("fuzz: forward failed");
    return Compute(chunks, {});
  }

  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override {
    for (const BlockCopy& c : copies) {
      FUZZ_CHECK(c.src < blocks_ && c.dst < blocks_ && c.src != c.dst);
    }
    if (failures_->NextFails()) return absl::InternalError("fuzz: block copy failed");
    return absl::OkStatus();
  }

  bool SupportsPipelinedDecode() const override { return pipelined_; }

  absl::Status Launch(std::span<const ForwardChunk> chunks,
                      std::span<const int32_t> previous_step_rows) override {
    FUZZ_CHECK(pipelined_);
    FUZZ_CHECK(launched_.size() < 2);  // at most two uncollected steps
    FUZZ_CHECK(ValidateForwardChunks(chunks, config_, blocks_).ok());
    if (!previous_step_rows.empty()) {
      FUZZ_CHECK(previous_step_rows.size() == chunks.size());
      FUZZ_CHECK(have_last_launched_);
    }
    if (failures_->NextFails()) {
      have_last_launched_ = false;  // nothing launched: no step to chain from
      return absl::InternalError("fuzz: launch failed");
    }
    std::vector<int32_t> inputs;
    for (size_t i = 0; i < previous_step_rows.size(); ++i) {
      FUZZ_CHECK(chunks[i].tokens.size() == 1);
      const int32_t row = previous_step_rows[i];
      FUZZ_CHECK(row >= 0 && static_cast<size_t>(row) < last_launched_ids_.size());
      inputs.push_back(last_launched_ids_[row]);
    }
    absl::StatusOr<ForwardOutput> out = Compute(chunks, inputs);
    last_launched_ids_ = out->token_ids;
    have_last_launched_ = true;
    launched_.push_back(std::move(out));
    return absl::OkStatus();
  }

  absl::StatusOr<ForwardOutput> Collect() override {
    FUZZ_CHECK(!launched_.empty());
    absl::StatusOr<ForwardOutput> out = std::move(launched_.front());
    launched_.pop_front();
    if (failures_->NextFails()) return absl::InternalError("fuzz: collect failed");
    return out;
  }

 private:
  // `inputs`, when not empty, replaces each (one-token) chunk's token.
  absl::StatusOr<ForwardOutput> Compute(std::span<const ForwardChunk> chunks,
                                        std::span<const int32_t> inputs) {
    const int64_t vocab = config_.vocab_size;
    std::vector<float> logits;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const ForwardChunk& ch = chunks[c];
      if (!ch.emit_logits) continue;
      const size_t n = ch.tokens.size();
      for (size_t t = ch.logits_for_all_tokens ? 0 : n - 1; t < n; ++t) {
        const int32_t token = inputs.empty() ? ch.tokens[t] : inputs[c];
        const int64_t pos = ch.segment_delta + ch.local_start + static_cast<int64_t>(t);
        // EOS (256) wins now and then; bytes otherwise.
        const uint32_t h = static_cast<uint32_t>(token) * 2654435761u ^
                           static_cast<uint32_t>(pos) * 40503u ^ salt_;
        const int32_t best = (h % 23 == 0) ? 256 : static_cast<int32_t>(h % 256);
        const size_t row = logits.size();
        logits.resize(row + vocab, 0.0f);
        for (int64_t v = 0; v < vocab; ++v) logits[row + v] = static_cast<float>((h >> (v % 13)) & 7);
        logits[row + best] = 16.0f;
      }
    }
    return SampleRowsOnHost(chunks, std::move(logits), vocab);
  }

  ModelConfig config_;
  int64_t blocks_;
  bool pipelined_;
  uint8_t salt_;
  FailureSchedule* failures_;
  std::deque<absl::StatusOr<ForwardOutput>> launched_;
  std::vector<int32_t> last_launched_ids_;
  bool have_last_launched_ = false;
};

// What the callbacks saw of one request.
struct Tracker {
  int done = 0;
  int tokens = 0;
};

constexpr const char* kSystemPrefixes[] = {
    "",
    "S",
    "You answer from the documents below, briefly and exactly.\n",  // more than a block
};
constexpr const char* kQuestions[] = {"Q?", "Which document says so, and where exactly?"};

struct Harness {
  explicit Harness(FuzzInput& in) : tokenizer(MakeByteTokenizer()) {
    config = TinyTestConfig();
    config.max_positions = 512 + 256 * in.Range(0, 3);
    for (int d = 0; d < kNumDocuments; ++d) {
      const int len = static_cast<int>(in.Range(1, kMaxDocumentBytes));
      const uint8_t seed = in.Byte();
      std::string text;
      for (int i = 0; i < len; ++i) text.push_back(static_cast<char>('a' + (seed + 7 * i) % 26));
      documents.push_back(text);
      document_ids.push_back(tokenizer->Encode(text, /*parse_special=*/false));
    }
    const int failures = static_cast<int>(in.Range(0, 4));
    for (int i = 0; i < failures; ++i) schedule.Add(static_cast<int>(in.Range(0, 95)));
    const int64_t blocks = in.Range(2, 48);
    const bool pipelined = in.Bool();
    EngineOptions options;
    options.num_kv_blocks = blocks;
    options.max_batch_tokens = static_cast<int>(in.Range(1, 8)) * 8;
    options.max_running = static_cast<int>(in.Range(1, 8));
    options.pipeline_decode = in.Bool();
    options.check_pool_every_step = true;
    core = std::make_unique<EngineCore>(
        std::make_unique<FakeRunner>(config, blocks, pipelined, in.Byte(), &schedule),
        tokenizer.get(), options);
  }

  void AddRequest(FuzzInput& in) {
    EngineRequest r;
    r.system_prefix = kSystemPrefixes[in.Range(0, 2)];
    const int docs = static_cast<int>(in.Range(0, 5));
    for (int i = 0; i < docs; ++i) {
      // Documents repeat across requests and within one; a document arrives as text or as the
      // token ids its text encodes to (the same tokens under another cache key).
      const int d = static_cast<int>(in.Range(0, kNumDocuments - 1));
      EngineDocument doc{.id = "doc" + std::to_string(d)};
      if (in.Bool()) {
        doc.token_ids = document_ids[d];
      } else {
        doc.text = documents[d];
      }
      r.documents.push_back(std::move(doc));
    }
    r.question = kQuestions[in.Range(0, 1)];
    r.mode = static_cast<CacheMode>(in.Range(0, 3));
    r.sampling.max_tokens = static_cast<int>(in.Range(1, 12));
    r.sampling.ignore_eos = in.Bool();
    const uint8_t sampling = in.Byte();
    if (sampling & 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = in.Byte();
    }
    if (sampling & 2) {
      r.sampling.repetition_penalty = 1.3f;
      r.sampling.frequency_penalty = 0.5f;
    }
    if (sampling & 4) r.sampling.stop = {"ab"};
    r.sampling.logprobs = (sampling & 8) != 0;
    const uint8_t deadline = in.Byte();
    if (deadline < 64) r.deadline = now + absl::Milliseconds(deadline);

    absl::StatusOr<PreparedRequest> p =
        PrepareRequest(r, *tokenizer, config, {"fuzz-model", "fuzz-tokenizer"}, {});
    if (!p.ok()) return;  // refused before reaching the core
    trackers.push_back(std::make_unique<Tracker>());
    Tracker* t = trackers.back().get();
    p->callbacks.on_token = [t](int32_t, std::string_view) {
      FUZZ_CHECK(t->done == 0);
      ++t->tokens;
    };
    p->callbacks.on_done = [t](const absl::Status&, const RequestResult&) {
      FUZZ_CHECK(t->done == 0);
      ++t->done;
    };
    ids.push_back(core->Add(*std::move(p)));
  }

  void Step() {
    core->Step(now);
    FUZZ_CHECK(core->cache().CheckInvariant().ok());
    // The core's own pool checks found nothing either (that stop is Internal). Injected step
    // failures may stop it serving on purpose (engine.max_consecutive_step_failures in a row):
    // that stop is Unavailable, and every request must still end, which the drain checks.
    FUZZ_CHECK(core->health().ok() || absl::IsUnavailable(core->health()));
  }

  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> documents;
  std::vector<std::vector<int32_t>> document_ids;
  FailureSchedule schedule;
  absl::Time now = MonotonicNow();  // the engine stamps requests with it
  // Declared before the core: the core's destructor may still call the callbacks.
  std::vector<std::unique_ptr<Tracker>> trackers;
  std::vector<uint64_t> ids;
  std::unique_ptr<EngineCore> core;
};

}  // namespace
}  // namespace lazyattn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lazyattn;
  FuzzInput in(data, size);
  Harness h(in);
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    const uint8_t choice = in.Byte() % 8;
    if (choice < 3) {
      h.AddRequest(in);
    } else if (choice == 3) {
      if (!h.ids.empty()) h.core->Cancel(h.ids[in.Range(0, h.ids.size() - 1)]);
    } else if (choice == 4) {
      h.now += absl::Milliseconds(in.Range(0, 40));
    } else {
      h.Step();
    }
  }
  int steps = 0;
  while (h.core->HasWork()) {
    FUZZ_CHECK(++steps < kMaxDrainSteps);  // a request that never ends
    h.now += absl::Milliseconds(1);
    h.Step();
  }
  for (const auto& t : h.trackers) FUZZ_CHECK(t->done == 1);
  FUZZ_CHECK(h.core->cache().pool().num_referenced() == 0);
  FUZZ_CHECK(h.core->cache().CheckInvariant().ok());
  return 0;
}
