// The engine's own host time per step, with a runner that does no work: what scheduling,
// block tables, sampling bookkeeping and streaming cost per step at a given batch, i.e. the
// floor under any backend's step time. Prints a table.
//
//   lazyattn-bench-engine-overhead [--batches 1,32,240] [--context 2048[,32768,...]]
//                                  [--steps 64] [--tokenizer MODEL] [--decode-only]
//                                  [--waiting 1024[,...]] [--penalties]
//
// Each (batch, context) row times `steps` decode steps of `batch` requests of `context` prompt
// tokens (mode full), in wall time and in the engine thread's CPU time; the block tables persist
// between steps, so neither should grow with the context.
//
// With --penalties: a penalized row's host work at one decode step for histories of each
// --context, recounted whole against kept counts (PrintPenaltyCosts).
//
// With --waiting: what publishing the load costs the engine thread after each step while that
// many RAG requests (5 documents each, lazy mode) wait for admission: EngineCore::Load (the exact
// figure) and PublishedLoad at 6 ms steps (the estimate recomputed every 50 ms).
//
// Then the host time of an all-documents-cached RAG request (5 documents of ~4,096 tokens and a
// 64-token question, lazy mode, one output token) through the threaded Engine: TTFT from
// Engine::Submit with a runner that costs nothing, i.e. what a GPU step's TTFT adds to its own;
// with the documents as token ids, and as text with the engine's token cache off and on
// (--tokenizer MODEL tokenizes with that model's tokenizer instead of bytes).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <iostream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/monotonic_time.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/sampler.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {
namespace {

// Answers every step at once: every emitting row draws token 7 (return_logits rows add zeros).
class NullRunner final : public ModelRunner {
 public:
  NullRunner(ModelConfig config, int64_t blocks) : config_(std::move(config)), blocks_(blocks) {}
  const ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return "null"; }
  int64_t num_kv_blocks() const override { return blocks_; }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    last_forward = std::chrono::steady_clock::now();
    ForwardOutput out;
    for (const ForwardChunk& ch : chunks) {
      if (!ch.emit_logits) continue;
      out.token_ids.push_back(7);
      out.logprobs.push_back(0.0f);
      if (ch.return_logits) out.logits.resize(out.logits.size() + config_.vocab_size, 0.0f);
    }
    return out;
  }
  absl::Status CopyBlocks(std::span<const BlockCopy>) override { return absl::OkStatus(); }

  std::atomic<std::chrono::steady_clock::time_point> last_forward{};  // entry of the last call

 private:
  ModelConfig config_;
  int64_t blocks_;
};

// This thread's CPU time (CLOCK_THREAD_CPUTIME_ID), in microseconds.
double ThreadCpuMicros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

std::vector<int32_t> DocumentTokens(int id, int length) {
  std::mt19937 rng(1000003u * static_cast<uint32_t>(id) + 17);
  std::vector<int32_t> t(length);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 250);
  return t;
}

// A document of about `words` English-like words, the same for the same id.
std::string DocumentText(int id, int words) {
  static constexpr const char* kWords[] = {
      "the",    "river",  "flows",   "through", "a",      "city",    "of",      "bridges",
      "and",    "its",    "water",   "reaches", "sea",    "after",   "many",    "miles",
      "north",  "south",  "valley",  "mountain", "rises", "in",      "spring",  "summer",
      "trade",  "boats",  "carried", "goods",   "ancient", "roman",  "walls",   "1,006"};
  std::mt19937 rng(7919u * static_cast<uint32_t>(id) + 3);
  std::string text;
  for (int w = 0; w < words; ++w) {
    text += kWords[rng() % std::size(kWords)];
    text += (w % 17 == 16) ? ".\n" : " ";
  }
  return text;
}

struct RagTiming {
  double ttft_us = 0, submit_us = 0, pickup_us = 0;
};

// Medians over 20 all-cached repeats of the request (its documents reordered every time), after
// one cold use. Documents as token ids, or as text (tokenized by Submit unless the engine's token
// cache holds them: `token_cache_tokens` 0 turns it off).
absl::StatusOr<RagTiming> RagOverhead(const ModelConfig& config, const Tokenizer& tokenizer,
                                      bool text_documents, int64_t token_cache_tokens) {
  constexpr int kDocs = 5, kDocTokens = 4096, kRepeats = 21;
  auto runner = std::make_unique<NullRunner>(config, 8192);
  NullRunner* null_runner = runner.get();
  Engine engine(std::move(runner), "null", &tokenizer,
                EngineOptions{.max_batch_tokens = 8192,
                              .max_running = 64,
                              .document_token_cache_tokens = token_cache_tokens});
  using Clock = std::chrono::steady_clock;
  const auto us = [](Clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
  };
  std::vector<std::string> texts;
  for (int d = 0; d < kDocs; ++d) texts.push_back(DocumentText(d, kDocTokens * 3 / 4));
  std::vector<double> ttft, prep, pickup;
  for (int rep = 0; rep <= kRepeats; ++rep) {
    EngineRequest r{.mode = CacheMode::kLazy, .sampling = {.max_tokens = 1, .ignore_eos = true}};
    for (int d = 0; d < kDocs; ++d) {
      const int id = (d + rep) % kDocs;  // reordered every time, cached after the first
      if (text_documents) {
        r.documents.push_back({.id = absl::StrCat("doc", id), .text = texts[id]});
      } else {
        r.documents.push_back({.id = absl::StrCat("doc", id),
                               .token_ids = DocumentTokens(id, kDocTokens)});
      }
    }
    r.question_token_ids = DocumentTokens(-1 - rep, 64);
    absl::Notification done;
    absl::Status status;
    RequestResult result;
    const Clock::time_point start = Clock::now();
    auto id = engine.Submit(r, {.on_done = [&](const absl::Status& s, const RequestResult& res) {
                                  status = s;
                                  result = res;
                                  done.Notify();
                                }});
    const Clock::time_point submitted = Clock::now();
    if (!id.ok()) return id.status();
    done.WaitForNotification();
    if (!status.ok()) return status;
    if (rep == 0) continue;  // the documents' first (cold) use
    if (result.usage.document_cached_tokens != result.usage.document_tokens) {
      return absl::InternalError("a repeated request's documents were not all cached");
    }
    ttft.push_back(result.ttft_ms * 1000);
    prep.push_back(us(submitted - start));
    pickup.push_back(us(null_runner->last_forward.load() - submitted));
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return RagTiming{median(ttft), median(prep), median(pickup)};
}

int PrintRagOverhead(const ModelConfig& config, const Tokenizer& tokenizer,
                     const std::string& tokenizer_name) {
  std::cout << "\nAll-cached RAG request (5 documents of ~4,096 tokens + a 64-token question), "
               "null runner, medians of 20:\n\n"
            << "| tokenizer | documents as | token cache | TTFT us | Submit (prepare, tokenize, "
               "hash) us | Forward entry minus Submit return us (< 0: picked up first) |\n"
            << "|---|---|---|---|---|---|\n";
  struct Variant {
    bool text;
    int64_t cache;
  };
  const int64_t default_cache = EngineOptions{}.document_token_cache_tokens;
  for (Variant v : {Variant{false, 0}, Variant{true, 0}, Variant{true, default_cache}}) {
    auto t = RagOverhead(config, tokenizer, v.text, v.cache);
    if (!t.ok()) {
      std::cerr << t.status() << "\n";
      return 1;
    }
    std::cout << "| " << tokenizer_name << " | " << (v.text ? "text" : "token ids") << " | "
              << (v.text ? (v.cache > 0 ? "on" : "off") : "-") << " | " << t->ttft_us << " | "
              << t->submit_us << " | " << t->pickup_us << " |\n";
  }
  return 0;
}

// Microseconds of this thread's CPU per call of Load() and of PublishedLoad() at 6 ms steps, with
// `waiting` requests queued.
// The host cost of a penalized row at one decode step, per history length: recounting the whole
// history (PenaltyEntries; what every step did before the counts were kept) against bringing
// the kept counts up by the step's one new token (PenaltyCounts::Sync), each followed by the
// copy a backend makes of the entries (RowAdjustments). Ids drawn from 32,000 distinct ones, a
// large BPE vocabulary's share of a long text. Medians of 9 repeats of 16 steps.
void PrintPenaltyCosts(const std::vector<int>& contexts) {
  SamplingRowParams row;
  row.presence_penalty = 0.5f;
  std::cout << "\n| history tokens | distinct ids | recount us/row/step | kept counts us/row/step "
               "|\n|---|---|---|---|\n";
  for (int context : contexts) {
    std::mt19937 rng(static_cast<uint32_t>(context));
    std::vector<int32_t> history(context + 16 * 10);
    for (int32_t& t : history) t = static_cast<int32_t>(rng() % 32000);
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::vector<double> recount, kept;
    size_t distinct = 0;
    PenaltyCounts counts;
    counts.Sync(std::span(history).first(context), 64);
    for (int rep = 0; rep < 9; ++rep) {
      const int64_t base = context + 16 * rep;
      auto start = std::chrono::steady_clock::now();
      for (int s = 1; s <= 16; ++s) {
        const auto e =
            RowAdjustments(row, PenaltyEntries(std::span(history).first(base + s), 64), {});
        distinct = e.size();
      }
      recount.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count() /
          16);
      start = std::chrono::steady_clock::now();
      for (int s = 1; s <= 16; ++s) {
        const auto e = RowAdjustments(row, counts.Sync(std::span(history).first(base + s), 64), {});
        if (e.size() != distinct && s == 16) std::cerr << "counts differ from the recount\n";
      }
      kept.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count() /
          16);
    }
    std::cout << "| " << context << " | " << distinct << " | " << median(recount) << " | "
              << median(kept) << " |\n";
  }
}

int PrintPublishedLoad(const ModelConfig& config, const Tokenizer& tokenizer,
                       const std::vector<int>& waiting_counts) {
  std::cout << "\nPublishing the load after a step, RAG requests waiting (5 documents of 4,096 "
               "tokens each, 64 distinct documents):\n\n"
            << "| waiting | Load() CPU us | PublishedLoad() CPU us at 6 ms steps |\n"
            << "|---|---|---|\n";
  for (int waiting : waiting_counts) {
    EngineCore core(std::make_unique<NullRunner>(config, 1 << 16), &tokenizer,
                    {.max_batch_tokens = 8192, .max_running = 1});
    for (int i = 0; i < waiting; ++i) {
      PreparedRequest r;
      r.mode = CacheMode::kLazy;
      for (int d = 0; d < 5; ++d) {
        PreparedRequest::Document doc;
        doc.id = absl::StrCat("doc", (i * 5 + d) % 64);
        doc.key = DocumentKey{.hi = static_cast<uint64_t>((i * 5 + d) % 64 + 1), .lo = 7};
        doc.tokens.assign(4096, 5);
        r.documents.push_back(std::move(doc));
      }
      r.question.assign(64, 9);
      r.sampling = {.max_tokens = 1, .ignore_eos = true};
      core.Add(std::move(r));
    }
    constexpr int kCalls = 200;
    int64_t sink = 0;
    double start = ThreadCpuMicros();
    for (int c = 0; c < kCalls; ++c) sink += core.Load().queued_prefill_tokens;
    const double exact_us = (ThreadCpuMicros() - start) / kCalls;
    absl::Time now = MonotonicNow();
    start = ThreadCpuMicros();
    for (int c = 0; c < kCalls; ++c) {
      sink += core.PublishedLoad(now).queued_prefill_tokens;
      now += absl::Milliseconds(6);
    }
    const double published_us = (ThreadCpuMicros() - start) / kCalls;
    if (sink <= 0) return 1;  // keeps the calls; a queue always has prefill to do
    std::cout << "| " << waiting << " | " << exact_us << " | " << published_us << " |\n";
  }
  return 0;
}

int Main(int argc, char** argv) {
  CliArgs args;
  args.Declare("batches", CliArgs::Kind::kValue, "decode batch sizes (default 1,32,240)");
  args.Declare("context", CliArgs::Kind::kValue,
               "prompt tokens per request, a list (default 2048)");
  args.Declare("decode-only", CliArgs::Kind::kSwitch,
               "only the decode rows, not the all-cached RAG request");
  args.Declare("steps", CliArgs::Kind::kValue, "decode steps timed (default 64)");
  args.Declare("waiting", CliArgs::Kind::kValue,
               "also time publishing the load with this many requests waiting, a list");
  args.Declare("penalties", CliArgs::Kind::kSwitch,
               "also time a penalized row's host work a step at each --context (recount against "
               "kept counts)");
  args.Declare("tokenizer", CliArgs::Kind::kValue,
               "a GGUF or HF model whose tokenizer tokenizes the text documents (default: bytes)");
  if (absl::Status s = args.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << s.message() << "\n" << args.Help();
    return 2;
  }
  const int steps = static_cast<int>(args.Int("steps", 64).value_or(64));
  std::vector<int> contexts, batches;
  for (auto [flag, list, fallback] : {std::tuple{"context", &contexts, "2048"},
                                      std::tuple{"batches", &batches, "1,32,240"}}) {
    for (absl::string_view v : absl::StrSplit(args.String(flag, fallback), ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(v, &n) || n < 1 || n > (1 << 20)) {
        std::cerr << "--" << flag << ": \"" << v << "\" is not a count from 1 to 1048576\n";
        return 2;
      }
      list->push_back(n);
    }
  }
  if (steps < 1) {
    std::cerr << "--steps: must be at least 1\n";
    return 2;
  }
  ModelConfig config = TinyTestConfig();
  config.max_positions = 1 << 20;
  auto tokenizer = MakeByteTokenizer();
  // Wall time, and the thread's CPU time, which a loaded machine's preemptions do not inflate.
  std::cout << "| batch | context | engine host us/step (wall) | CPU us/step | CPU us/request/step "
               "|\n|---|---|---|---|---|\n";
  for (int batch : batches) for (int context : contexts) {
    const int64_t blocks = int64_t{batch} * ((context + steps + 64) / 16 + 2);
    std::vector<int64_t> streamed(batch, 0);
    EngineCore core(std::make_unique<NullRunner>(config, blocks), tokenizer.get(),
                    {.max_batch_tokens = 1 << 20, .max_running = batch});
    for (int i = 0; i < batch; ++i) {
      PreparedRequest r;
      r.question.assign(context, 5);
      r.question[0] = i % 250;
      r.mode = CacheMode::kFull;
      r.sampling = {.max_tokens = steps + 64, .ignore_eos = true};
      r.callbacks.on_token = [&streamed, i](int32_t, std::string_view) { ++streamed[i]; };
      core.Add(std::move(r));
    }
    // Admission and the prefills (several steps when batch * context exceeds the step's token
    // budget), until every request has its first token; then one decode step more, so the timed
    // steps are all pure decode steps of the whole batch.
    const auto all_started = [&] {
      return std::all_of(streamed.begin(), streamed.end(), [](int64_t n) { return n > 0; });
    };
    for (int guard = 0; !all_started() && guard < 1024; ++guard) core.Step(MonotonicNow());
    core.Step(MonotonicNow());
    const int64_t before = std::accumulate(streamed.begin(), streamed.end(), int64_t{0});
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ThreadCpuMicros();
    for (int s = 0; s < steps; ++s) core.Step(MonotonicNow());
    const double cpu_us = (ThreadCpuMicros() - cpu_start) / steps;
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() / steps;
    const int64_t tokens = std::accumulate(streamed.begin(), streamed.end(), int64_t{0}) - before;
    if (tokens != int64_t{batch} * steps) {
      std::cerr << "expected " << batch * steps << " tokens in the timed steps, streamed "
                << tokens << "\n";
      return 1;
    }
    std::cout << "| " << batch << " | " << context << " | " << us << " | " << cpu_us << " | "
              << cpu_us / batch << " |\n";
  }
  if (args.Has("waiting")) {
    std::vector<int> waiting;
    for (absl::string_view v : absl::StrSplit(args.String("waiting", ""), ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(v, &n) || n < 1 || n > (1 << 16)) {
        std::cerr << "--waiting: \"" << v << "\" is not a count from 1 to 65536\n";
        return 2;
      }
      waiting.push_back(n);
    }
    if (int rc = PrintPublishedLoad(config, *tokenizer, waiting); rc != 0) return rc;
  }
  if (args.Has("penalties")) PrintPenaltyCosts(contexts);
  if (args.Has("decode-only")) return 0;
  auto llama = NamedModelShape("llama3-8b");
  if (!llama.ok()) return 1;
  if (args.Has("tokenizer")) {
    auto real = LoadTokenizer(args.String("tokenizer", ""));
    if (!real.ok()) {
      std::cerr << real.status() << "\n";
      return 1;
    }
    return PrintRagOverhead(*llama, **real, args.String("tokenizer", ""));
  }
  return PrintRagOverhead(*llama, *tokenizer, "bytes");
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) { return lazyattn::Main(argc, argv); }
