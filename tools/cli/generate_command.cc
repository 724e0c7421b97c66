// `lazyattn generate`: one request through the engine, streamed to stdout.
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tools/cli/cli_engine.h"
#include "tools/cli/commands.h"
#include "tools/cli/doc_files.h"

namespace lazyattn {

int GenerateCommand(int argc, char** argv) {
  CliArgs args;
  args.Declare("model", CliArgs::Kind::kValue, "a .gguf file or an HF model directory");
  args.Declare("prompt", CliArgs::Kind::kValue, "the question (the user message with --chat)");
  args.Declare("chat", CliArgs::Kind::kSwitch, "wrap the prompt in the model's chat template");
  args.Declare("system", CliArgs::Kind::kValue, "system text before the documents");
  DeclareDocFlags(args, "a document file, placed before the question");
  args.Declare("mode", CliArgs::Kind::kValue, "cache mode: full, prefix, block or lazy (default)");
  DeclareBackendFlags(args);
  args.Declare("json", CliArgs::Kind::kSwitch, "print one JSON object with ids, text and timings");
  args.Declare("help", CliArgs::Kind::kSwitch, "show this help");
  DeclareSamplingFlags(args);
  if (absl::Status s = args.Parse(argc, argv, 2); !s.ok()) {
    std::cerr << "lazyattn generate: " << s.message() << "\n" << args.Help();
    return 2;
  }
  if (args.Has("help")) {
    std::cout << "lazyattn generate flags:\n" << args.Help();
    return 0;
  }
  if (!args.Has("model") || !args.Has("prompt")) {
    std::cerr << "lazyattn generate: --model and --prompt are required\n" << args.Help();
    return 2;
  }
  auto sampling = SamplingFromArgs(args);
  auto mode = ParseCacheMode(args.String("mode", "lazy"));
  for (const absl::Status& s : {sampling.status(), mode.status()}) {
    if (!s.ok()) return CliFail(s, 2);
  }
  // Before the model, whose load may take minutes: a bad --doc is refused at once.
  auto docs = ReadDocFiles(args);
  if (!docs.ok()) return CliFail(docs.status(), 2);

  int load_exit = 0;
  auto model = ServedModelFromArgs(args, &load_exit);
  if (!model.ok()) return CliFail(model.status(), load_exit);
  auto parts = BuildPrompt(*model->tokenizer, args.Has("chat"), args.String("system"),
                           args.String("prompt"), /*has_documents=*/!args.Strings("doc").empty());
  if (!parts.ok()) return CliFail(parts.status());
  EngineRequest request{.system_prefix = parts->system_prefix,
                        .question = parts->question,
                        .mode = *mode,
                        .sampling = *sampling};
  const std::vector<std::string> paths = args.Strings("doc");
  for (size_t i = 0; i < paths.size(); ++i) {
    request.documents.push_back({.id = paths[i], .text = std::move((*docs)[i])});
  }

  const std::unique_ptr<Engine> engine_ptr = EngineFor(*model);
  Engine& engine = *engine_ptr;
  const bool json = args.Has("json");
  auto result = engine.Run(request, [&](int32_t, std::string_view text) {
    if (!json) std::cout << text << std::flush;
  });
  if (!result.ok()) return CliFail(result.status(), IsUsageError(result.status()) ? 2 : 1);
  if (json) {
    std::cout << ResultJson(*result, args.String("model"), *mode)
                     .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    std::cout << std::endl;
    std::cerr << absl::StrCat("[", result->usage.prompt_tokens, " prompt tokens (",
                              result->usage.cached_tokens, " cached), ", result->token_ids.size(),
                              " generated, finish ", result->finish_reason, ", TTFT ",
                              result->ttft_ms, " ms, decode ", result->decode_tokens_per_s,
                              " tokens/s]\n");
  }
  return 0;
}

}  // namespace lazyattn
