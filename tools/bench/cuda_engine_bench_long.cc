// lazyattn-bench-engine's `long` part: a RAG request at the model's whole context (tools/bench/
// cuda_engine_bench.h). Four documents of 32,700 tokens and a 64-token question make 130,864
// prompt tokens, with 64 output tokens 130,928 of llama3-8b's 131,072 positions: cold TTFT, the
// documents reordered (block mode's first reordering re-rotates its cached blocks to the new
// offsets; lazy mode reads them where they are), the same order again (all cached in both modes),
// and decode at that context.
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tools/bench/cuda_engine_bench.h"

namespace lazyattn::engine_bench {

absl::Status RunLongContext(Bench& b, int64_t kv_budget, json& out) {
  constexpr int kDocs = 4, kDocTokens = 32700, kQuestion = 64, kOutput = 64;
  constexpr int64_t kPositions = int64_t{kDocs} * kDocTokens + kQuestion + kOutput;
  std::cout << "\n### Long context (" << kDocs << " documents x " << kDocTokens << " tokens + "
            << kQuestion << "-token question, " << kOutput << " output tokens)\n\n";
  if (b.config.max_positions < kPositions) {
    // Said, not skipped silently: a shape with a shorter context cannot run this part.
    std::cout << "not run: shape " << b.config.name << " holds " << b.config.max_positions
              << " positions, the request needs " << kPositions << "\n";
    out["long"] = {{"not_run", absl::StrCat("max_positions ", b.config.max_positions)}};
    return absl::OkStatus();
  }
  std::cout << "| mode | cold TTFT ms | reordered, first time: TTFT ms (docs hit) | "
               "reordered again: TTFT ms (docs hit) | decode ms/token at 128K |\n"
               "|---|---|---|---|---|\n";
  for (CacheMode mode : {CacheMode::kBlock, CacheMode::kLazy}) {
    ASSIGN_OR_RETURN(auto engine, b.MakeEngine(kv_budget, 4));
    // Warm-up (cuBLAS plans, the prefill kernels' first launches) on documents used nowhere else.
    RETURN_IF_ERROR(engine->Run(RagRequest({990, 991, 992, 993}, 2048, 0, mode, 4)).status());
    ASSIGN_OR_RETURN(auto cold, engine->Run(RagRequest({1, 2, 3, 4}, kDocTokens, 1, mode, kOutput)));
    ASSIGN_OR_RETURN(auto first, engine->Run(RagRequest({3, 1, 4, 2}, kDocTokens, 2, mode, 1)));
    ASSIGN_OR_RETURN(auto again, engine->Run(RagRequest({3, 1, 4, 2}, kDocTokens, 3, mode, 1)));
    const double decode_ms =
        cold.decode_tokens_per_s > 0 ? 1000.0 / cold.decode_tokens_per_s : 0;
    const std::string name(CacheModeName(mode));
    std::cout << absl::StrCat("| ", name, " | ", cold.ttft_ms, " | ", first.ttft_ms, " (",
                              first.usage.documents_hit, "/", first.usage.documents, ") | ",
                              again.ttft_ms, " (", again.usage.documents_hit, "/",
                              again.usage.documents, ") | ", decode_ms, " |\n");
    out["long"][name] = {{"cold_ttft_ms", cold.ttft_ms},
                         {"reordered_first_ttft_ms", first.ttft_ms},
                         {"reordered_first_docs_hit", first.usage.documents_hit},
                         {"reordered_again_ttft_ms", again.ttft_ms},
                         {"reordered_again_docs_hit", again.usage.documents_hit},
                         {"decode_ms_per_token", decode_ms},
                         {"prompt_tokens", cold.usage.prompt_tokens}};
  }
  return absl::OkStatus();
}

}  // namespace lazyattn::engine_bench
