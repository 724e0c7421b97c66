// lazyattn-cachesim: replays synthetic RAG traces against the worker's cache classes and prints
// document-token hit ratios per KV budget, Zipf skew and cache mode (markdown table, then one JSON
// line per row); `closed-form` checks DESIGN.md section 1's position-multiplicity formula.
//
//   lazyattn-cachesim replay --budgets 1GiB,10GiB --skews 2.1,1.1 --modes prefix,block,lazy
//   lazyattn-cachesim closed-form --capacity 100 --positions 20 --skews 0.85
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/worker/cache/cache_mode.h"
#include "tools/cachesim/closed_form.h"
#include "tools/cachesim/kv_budget.h"
#include "tools/cachesim/replay.h"
#include "tools/cachesim/trace.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {
namespace {

using Kind = CliArgs::Kind;

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    out.emplace_back(piece.data(), piece.size());
  }
  return out;
}

absl::StatusOr<std::vector<double>> ParseSkews(const CliArgs& args, const std::string& fallback) {
  std::vector<double> skews;
  for (const std::string& s : SplitList(args.String("skews", fallback))) {
    double a;
    if (!absl::SimpleAtod(s, &a) || !(a >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--skews: \"", s, "\" is not a Zipf exponent >= 0"));
    }
    skews.push_back(a);
  }
  if (skews.empty()) return absl::InvalidArgumentError("--skews: empty list");
  return skews;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

void DeclareTraceFlags(CliArgs& args) {
  args.Declare("documents", Kind::kValue, "documents in the pool (default 100000)");
  args.Declare("doc-tokens", Kind::kValue, "tokens per document, the maximum (default 512)");
  args.Declare("doc-tokens-min", Kind::kValue,
               "shortest document; lengths are uniform in [min, max] (default: --doc-tokens)");
  args.Declare("docs-per-request", Kind::kValue, "distinct documents per request (default 5)");
  args.Declare("requests", Kind::kValue, "requests in the trace (default 10000)");
  args.Declare("system-tokens", Kind::kValue, "shared system prompt length (default 64)");
  args.Declare("question-tokens", Kind::kValue, "unique question tokens per request (default 64)");
  args.Declare("seed", Kind::kValue, "trace seed (default 1)");
}

absl::StatusOr<TraceOptions> TraceFlags(const CliArgs& args) {
  TraceOptions o;
  ASSIGN_OR_RETURN(o.num_documents, args.Int("documents", o.num_documents));
  ASSIGN_OR_RETURN(o.doc_tokens_max, args.Int("doc-tokens", o.doc_tokens_max));
  ASSIGN_OR_RETURN(o.doc_tokens_min, args.Int("doc-tokens-min", o.doc_tokens_max));
  ASSIGN_OR_RETURN(int64_t k, args.Int("docs-per-request", o.docs_per_request));
  if (k < 1 || k > 100000) return absl::InvalidArgumentError("--docs-per-request out of range");
  o.docs_per_request = static_cast<int>(k);
  ASSIGN_OR_RETURN(o.num_requests, args.Int("requests", o.num_requests));
  ASSIGN_OR_RETURN(o.system_tokens, args.Int("system-tokens", o.system_tokens));
  ASSIGN_OR_RETURN(o.question_tokens, args.Int("question-tokens", o.question_tokens));
  ASSIGN_OR_RETURN(int64_t seed, args.Int("seed", 1));
  o.seed = static_cast<uint64_t>(seed);
  return o;
}

absl::Status RunReplay(int argc, char** argv) {
  CliArgs args;
  DeclareTraceFlags(args);
  args.Declare("model", Kind::kValue, "KV shape: llama3-8b (default) or smollm2-135m");
  args.Declare("budgets", Kind::kValue, "KV budgets, comma-separated (default 1GiB,10GiB,50GiB)");
  args.Declare("skews", Kind::kValue, "Zipf exponents, comma-separated (default 2.1,1.1,1.5)");
  args.Declare("modes", Kind::kValue, "cache modes (default prefix,block,lazy)");
  args.Declare("block-size", Kind::kValue, "tokens per KV block (default 16)");
  args.Declare("check-every", Kind::kValue, "check the cache invariant every N requests (1000)");
  args.Declare("warmup", Kind::kValue, "requests left out of the counts (default 0)");
  args.Declare("help", Kind::kSwitch, "this text");
  RETURN_IF_ERROR(args.Parse(argc, argv, 2));
  if (args.Has("help")) {
    std::cout << "lazyattn-cachesim replay [flags]\n" << args.Help();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(TraceOptions trace_options, TraceFlags(args));
  ASSIGN_OR_RETURN(const ModelShape shape, FindModelShape(args.String("model", "llama3-8b")));
  ASSIGN_OR_RETURN(const std::vector<double> skews, ParseSkews(args, "2.1,1.1,1.5"));
  ASSIGN_OR_RETURN(const int64_t block_size, args.Int("block-size", 16));
  if (block_size < 1 || block_size > 4096) {
    return absl::InvalidArgumentError("--block-size must be in [1, 4096]");
  }
  ReplayOptions replay_options{.block_size = static_cast<int>(block_size)};
  ASSIGN_OR_RETURN(replay_options.check_every, args.Int("check-every", 1000));
  ASSIGN_OR_RETURN(replay_options.warmup_requests, args.Int("warmup", 0));
  std::vector<std::pair<std::string, int64_t>> budgets;  // label, blocks
  for (const std::string& b : SplitList(args.String("budgets", "1GiB,10GiB,50GiB"))) {
    auto bytes = ParseByteSize(b);
    if (!bytes.ok())
      return absl::InvalidArgumentError(absl::StrCat("--budgets: ", bytes.status().message()));
    const int64_t blocks =
        BlocksForBudget(*bytes, shape.BytesPerToken(), replay_options.block_size);
    if (blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--budgets: ", b, " holds no block of ",
                                                     block_size, " tokens of ", shape.name));
    }
    budgets.emplace_back(b, blocks);
  }
  std::vector<CacheMode> modes;
  for (const std::string& m : SplitList(args.String("modes", "prefix,block,lazy"))) {
    auto mode = ParseCacheMode(m);
    if (!mode.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--modes: ", mode.status().message()));
    }
    if (*mode == CacheMode::kFull) {
      return absl::InvalidArgumentError("--modes: the simulator replays prefix, block and lazy");
    }
    modes.push_back(*mode);
  }
  if (budgets.empty() || modes.empty()) {
    return absl::InvalidArgumentError("--budgets and --modes need at least one value each");
  }
  std::vector<Trace> traces;  // one per skew, all generated (and validated) before any output
  for (double a : skews) {
    trace_options.zipf_a = a;
    ASSIGN_OR_RETURN(Trace trace, GenerateTrace(trace_options));
    traces.push_back(std::move(trace));
  }

  std::cout << absl::StrFormat(
      "model %s (%d B/token), block %d tokens; trace: %d documents of %d-%d tokens, %d per "
      "request, %d requests, system %d tokens, question %d tokens, seed %d\n\n",
      shape.name, shape.BytesPerToken(), block_size, trace_options.num_documents,
      trace_options.doc_tokens_min, trace_options.doc_tokens_max, trace_options.docs_per_request,
      trace_options.num_requests, trace_options.system_tokens, trace_options.question_tokens,
      trace_options.seed);
  std::cout << "| budget | blocks | skew a | mode | hit % | copy % | hit+copy % | hits | copies "
               "| uncached | evicted docs | unlimited % |\n"
               "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  std::vector<std::string> json_lines;
  for (size_t t = 0; t < skews.size(); ++t) {
    const double a = skews[t];
    const Trace& trace = traces[t];
    const TraceSummary summary = Summarize(trace);
    for (const auto& [label, blocks] : budgets) {
      for (CacheMode mode : modes) {
        replay_options.mode = mode;
        replay_options.num_blocks = blocks;
        const auto start = std::chrono::steady_clock::now();
        ASSIGN_OR_RETURN(const ReplayStats s, Replay(trace, replay_options));
        const double seconds = Seconds(start);
        std::cerr << absl::StrFormat("  %s a=%g %s: %.1f s, %d invariant checks passed\n", label, a,
                                     CacheModeName(mode), seconds, s.invariant_checks);
        std::cout << absl::StrFormat(
            "| %s | %d | %g | %s | %.2f | %.2f | %.2f | %d | %d | %d | %d | %.2f |\n", label,
            blocks, a, CacheModeName(mode), 100 * s.HitRatio(), 100 * s.CopyRatio(),
            100 * (s.HitRatio() + s.CopyRatio()), s.hit_refs, s.copy_refs, s.uncached_refs,
            s.evicted_docs, 100 * summary.UnlimitedHitRatio());
        std::cout.flush();
        nlohmann::json j = {{"budget", label},
                            {"budget_blocks", blocks},
                            {"model", shape.name},
                            {"skew", a},
                            {"mode", std::string(CacheModeName(mode))},
                            {"hit_ratio", s.HitRatio()},
                            {"copy_ratio", s.CopyRatio()},
                            {"requests", s.requests},
                            {"doc_refs", s.doc_refs},
                            {"doc_tokens", s.doc_tokens},
                            {"hit_refs", s.hit_refs},
                            {"hit_tokens", s.hit_tokens},
                            {"copy_refs", s.copy_refs},
                            {"copy_tokens", s.copy_tokens},
                            {"uncached_refs", s.uncached_refs},
                            {"failed_allocations", s.failed_allocations},
                            {"evicted_docs", s.evicted_docs},
                            {"cached_docs_end", s.cached_docs_end},
                            {"prefix_blocks_end", s.prefix_blocks_end},
                            {"invariant_checks", s.invariant_checks},
                            {"unlimited_lazy_hit_ratio", summary.UnlimitedHitRatio()},
                            {"distinct_docs", summary.distinct_docs},
                            {"seconds", seconds},
                            {"trace",
                             {{"documents", trace_options.num_documents},
                              {"doc_tokens_min", trace_options.doc_tokens_min},
                              {"doc_tokens_max", trace_options.doc_tokens_max},
                              {"docs_per_request", trace_options.docs_per_request},
                              {"requests", trace_options.num_requests},
                              {"system_tokens", trace_options.system_tokens},
                              {"question_tokens", trace_options.question_tokens},
                              {"seed", trace_options.seed}}}};
        json_lines.push_back(j.dump());
      }
    }
  }
  std::cout << "\n";
  for (const std::string& line : json_lines) std::cout << line << "\n";
  return absl::OkStatus();
}

absl::Status RunClosedForm(int argc, char** argv) {
  CliArgs args;
  args.Declare("documents", Kind::kValue, "documents in the pool (default 10000)");
  args.Declare("capacity", Kind::kValue, "C: documents the cache holds (default 100)");
  args.Declare("positions", Kind::kValue, "D: positions a document can take (default 20)");
  args.Declare("skews", Kind::kValue, "Zipf exponents, comma-separated (default 0.85,1.1,1.5)");
  args.Declare("requests", Kind::kValue, "one-document requests (default 200000)");
  args.Declare("warmup", Kind::kValue, "requests left out of the counts (default 20000)");
  args.Declare("seed", Kind::kValue, "trace seed (default 1)");
  args.Declare("help", Kind::kSwitch, "this text");
  RETURN_IF_ERROR(args.Parse(argc, argv, 2));
  if (args.Has("help")) {
    std::cout << "lazyattn-cachesim closed-form [flags]\n" << args.Help();
    return absl::OkStatus();
  }
  PositionCheckOptions o;
  ASSIGN_OR_RETURN(o.num_documents, args.Int("documents", o.num_documents));
  ASSIGN_OR_RETURN(o.capacity, args.Int("capacity", o.capacity));
  ASSIGN_OR_RETURN(int64_t d, args.Int("positions", o.positions));
  if (d < 1 || d > 100000) return absl::InvalidArgumentError("--positions out of range");
  o.positions = static_cast<int>(d);
  ASSIGN_OR_RETURN(o.num_requests, args.Int("requests", o.num_requests));
  ASSIGN_OR_RETURN(o.warmup_requests, args.Int("warmup", o.warmup_requests));
  ASSIGN_OR_RETURN(int64_t seed, args.Int("seed", 1));
  o.seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(const std::vector<double> skews, ParseSkews(args, "0.85,1.1,1.5"));

  std::cout << absl::StrFormat(
      "C = %d cached documents, D = %d positions, %d documents, %d requests (%d warm-up), "
      "pool %d blocks\n\n",
      o.capacity, o.positions, o.num_documents, o.num_requests, o.warmup_requests,
      o.capacity + o.positions - 1);
  std::cout << "| skew a | formula gain (static top-C) | LRU gain (Che) | simulated gain | "
               "lazy hit % static / Che / sim | block hit % static / Che / sim |\n"
               "|---:|---:|---:|---:|---|---|\n";
  std::vector<std::string> json_lines;
  for (double a : skews) {
    o.zipf_a = a;
    ASSIGN_OR_RETURN(const PositionCheckResult r, RunPositionCheck(o));
    std::cout << absl::StrFormat(
        "| %g | %.3f | %.3f | %.3f | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f |\n", a,
        StaticPositionGain(o.capacity, o.positions, a), r.che_gain(), r.sim_gain(),
        100 * r.static_lazy, 100 * r.che_lazy, 100 * r.sim_lazy, 100 * r.static_block,
        100 * r.che_block, 100 * r.sim_block);
    std::cout.flush();
    json_lines.push_back(nlohmann::json{
        {"skew", a},
        {"capacity", o.capacity},
        {"positions", o.positions},
        {"formula_gain", StaticPositionGain(o.capacity, o.positions, a)},
        {"static_lazy", r.static_lazy},
        {"static_block", r.static_block},
        {"che_lazy", r.che_lazy},
        {"che_block", r.che_block},
        {"sim_lazy", r.sim_lazy},
        {"sim_block", r.sim_block},
        {"che_gain", r.che_gain()},
        {"sim_gain",
         r.sim_gain()}}.dump());
  }
  std::cout << "\n";
  for (const std::string& line : json_lines) std::cout << line << "\n";
  return absl::OkStatus();
}

constexpr char kUsage[] =
    "usage: lazyattn-cachesim replay [flags]        hit ratios per budget, skew and mode\n"
    "       lazyattn-cachesim closed-form [flags]   DESIGN.md section 1 formula vs simulation\n"
    "       lazyattn-cachesim COMMAND --help        the flags of a command\n";

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  absl::Status status;
  if (command == "replay") {
    status = RunReplay(argc, argv);
  } else if (command == "closed-form") {
    status = RunClosedForm(argc, argv);
  } else if (command == "help" || command == "--help" || command == "-h") {
    std::cout << kUsage;
    return 0;
  } else {
    std::cerr << "lazyattn-cachesim: unknown command \"" << command << "\"\n" << kUsage;
    return 2;
  }
  if (!status.ok()) {
    std::cerr << "lazyattn-cachesim " << command << ": " << status.message() << "\n";
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) { return lazyattn::Main(argc, argv); }
