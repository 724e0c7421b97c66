// The engine's own host time per step, with a runner that does no work: what scheduling,
// block tables, sampling bookkeeping and streaming cost per step at a given batch, i.e. the
// floor under any backend's step time. Prints a table.
//
//   lazyattn-bench-engine-overhead [--batches 1,32,240] [--context 2048] [--steps 64]
#include <chrono>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/model/random_weights.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {
namespace {

// Answers every step at once: greedy rows get token 7, other rows zero logits.
class NullRunner final : public ModelRunner {
 public:
  NullRunner(ModelConfig config, int64_t blocks) : config_(std::move(config)), blocks_(blocks) {}
  const ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return "null"; }
  int64_t num_kv_blocks() const override { return blocks_; }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    ForwardOutput out;
    for (const ForwardChunk& ch : chunks) {
      if (!ch.emit_logits) continue;
      if (ch.greedy) {
        out.greedy_ids.push_back(7);
      } else {
        out.logits.resize(out.logits.size() + config_.vocab_size, 0.0f);
      }
    }
    return out;
  }
  absl::Status CopyBlocks(std::span<const BlockCopy>) override { return absl::OkStatus(); }

 private:
  ModelConfig config_;
  int64_t blocks_;
};

int Main(int argc, char** argv) {
  CliArgs args;
  args.Declare("batches", CliArgs::Kind::kValue, "decode batch sizes (default 1,32,240)");
  args.Declare("context", CliArgs::Kind::kValue, "prompt tokens per request (default 2048)");
  args.Declare("steps", CliArgs::Kind::kValue, "decode steps timed (default 64)");
  if (absl::Status s = args.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << s.message() << "\n" << args.Help();
    return 2;
  }
  const int context = static_cast<int>(args.Int("context", 2048).value_or(2048));
  const int steps = static_cast<int>(args.Int("steps", 64).value_or(64));
  ModelConfig config = TinyTestConfig();
  config.max_positions = 1 << 20;
  auto tokenizer = MakeByteTokenizer();
  std::cout << "| batch | context | engine host us/step | us/request/step |\n|---|---|---|---|\n";
  for (absl::string_view b : absl::StrSplit(args.String("batches", "1,32,240"), ',')) {
    int batch = 0;
    if (!absl::SimpleAtoi(b, &batch) || batch < 1) continue;
    const int64_t blocks = int64_t{batch} * ((context + steps + 64) / 16 + 2);
    int64_t tokens = 0;
    EngineCore core(std::make_unique<NullRunner>(config, blocks), tokenizer.get(),
                    {.max_batch_tokens = 1 << 20, .max_running = batch});
    for (int i = 0; i < batch; ++i) {
      PreparedRequest r;
      r.question.assign(context, 5);
      r.question[0] = i % 250;
      r.mode = CacheMode::kFull;
      r.sampling = {.max_tokens = steps + 2, .ignore_eos = true};
      r.callbacks.on_token = [&tokens](int32_t, std::string_view) { ++tokens; };
      core.Add(std::move(r));
    }
    core.Step(absl::Now());  // admission and the prefill
    core.Step(absl::Now());  // first decode
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) core.Step(absl::Now());
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() / steps;
    if (tokens != int64_t{batch} * (steps + 2)) {
      std::cerr << "expected " << batch * (steps + 2) << " tokens, streamed " << tokens << "\n";
      return 1;
    }
    std::cout << "| " << batch << " | " << context << " | " << us << " | " << us / batch
              << " |\n";
  }
  return 0;
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) { return lazyattn::Main(argc, argv); }
