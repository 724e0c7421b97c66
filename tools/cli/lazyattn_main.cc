// `lazyattn`: the command-line front end of the engine.
//
//   lazyattn generate --model PATH --prompt TEXT [--chat] [--system TEXT] [--max-tokens N]
//                     [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop STR]...
//                     [--ignore-eos] [--json]
//
// Without --json the generated text streams to stdout and a summary goes to stderr; with --json one
// JSON object is printed at the end. Exit status: 0 on success, 2 for a usage error, 1 otherwise.
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/worker/engine/generator.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/tokenizer/chat_template.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {
namespace {

constexpr char kUsage[] =
    "usage: lazyattn COMMAND [flags]\n"
    "commands:\n"
    "  generate   generate a continuation of --prompt with the model at --model\n"
    "run `lazyattn COMMAND --help` for the flags of a command\n";

int Fail(const absl::Status& status, int code = 1) {
  std::cerr << "lazyattn: " << status.message() << "\n";
  return code;
}

absl::StatusOr<SamplingParams> SamplingFromArgs(const CliArgs& args) {
  SamplingParams p;
  auto max_tokens = args.Int("max-tokens", 128);
  auto temperature = args.Double("temperature", 0.0);
  auto top_k = args.Int("top-k", 0);
  auto top_p = args.Double("top-p", 1.0);
  auto seed = args.Int("seed", 0);
  for (const absl::Status& s : {max_tokens.status(), temperature.status(), top_k.status(),
                                top_p.status(), seed.status()}) {
    if (!s.ok()) return s;
  }
  p.max_tokens = static_cast<int>(*max_tokens);
  p.temperature = static_cast<float>(*temperature);
  p.top_k = static_cast<int>(*top_k);
  p.top_p = static_cast<float>(*top_p);
  p.seed = static_cast<uint64_t>(*seed);
  p.stop = args.Strings("stop");
  p.ignore_eos = args.Has("ignore-eos");
  return p;
}

int Generate(int argc, char** argv) {
  CliArgs args;
  args.Declare("model", CliArgs::Kind::kValue, "a .gguf file or an HF model directory");
  args.Declare("prompt", CliArgs::Kind::kValue, "the prompt text (the user message with --chat)");
  args.Declare("chat", CliArgs::Kind::kSwitch, "wrap the prompt in the model's chat template");
  args.Declare("system", CliArgs::Kind::kValue, "system message (with --chat)");
  args.Declare("max-tokens", CliArgs::Kind::kValue, "tokens to generate at most (default 128)");
  args.Declare("temperature", CliArgs::Kind::kValue, "0 = greedy (default 0)");
  args.Declare("top-k", CliArgs::Kind::kValue, "keep the k most likely tokens (0 = off)");
  args.Declare("top-p", CliArgs::Kind::kValue, "nucleus sampling mass (1 = off)");
  args.Declare("seed", CliArgs::Kind::kValue, "random seed for sampling (default 0)");
  args.Declare("stop", CliArgs::Kind::kRepeated, "stop before this string");
  args.Declare("ignore-eos", CliArgs::Kind::kSwitch, "keep generating past end-of-generation");
  args.Declare("json", CliArgs::Kind::kSwitch, "print one JSON object with ids, text and timings");
  args.Declare("help", CliArgs::Kind::kSwitch, "show this help");
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
  if (!sampling.ok()) return Fail(sampling.status(), 2);

  auto model = LoadModel(args.String("model"));
  if (!model.ok()) return Fail(model.status());
  const Tokenizer& tokenizer = *model->tokenizer;

  std::string prompt_text = args.String("prompt");
  if (args.Has("chat")) {
    auto tmpl = ChatTemplate::FromJinja(tokenizer.chat_template());
    if (!tmpl.ok()) return Fail(tmpl.status());
    std::vector<ChatMessage> messages;
    if (args.Has("system")) messages.push_back({"system", args.String("system")});
    messages.push_back({"user", prompt_text});
    auto rendered = tmpl->Apply(messages, /*add_generation_prompt=*/true);
    if (!rendered.ok()) return Fail(rendered.status());
    prompt_text = *rendered;
  } else if (args.Has("system")) {
    return Fail(absl::InvalidArgumentError("--system needs --chat"), 2);
  }
  // Chat templates spell their special tokens out; plain prompts may too (as llama.cpp's CLI).
  const std::vector<int32_t> prompt_ids = tokenizer.EncodeWithSpecials(prompt_text, true);

  const ModelConfig& config = model->weights->config;
  CpuRunner runner(model->weights.get());
  const int block_size = kDefaultKvBlockSize;
  const int64_t tokens_needed =
      std::min<int64_t>(config.max_positions, static_cast<int64_t>(prompt_ids.size()) +
                                                  sampling->max_tokens);
  KvCacheCpu kv(config, (tokens_needed + block_size - 1) / block_size);
  Generator generator(&runner, &tokenizer, &kv);

  const bool json = args.Has("json");
  auto result = generator.Generate(prompt_ids, *sampling, [&](int32_t, std::string_view text) {
    if (!json) {
      std::cout << text;
      std::cout.flush();
    }
  });
  if (!result.ok()) return Fail(result.status());
  if (json) {
    nlohmann::json out = {{"model", args.String("model")},
                          {"token_ids", result->token_ids},
                          {"text", result->text},
                          {"prompt_tokens", result->prompt_tokens},
                          {"completion_tokens", result->token_ids.size()},
                          {"finish_reason", result->finish_reason},
                          {"ttft_ms", result->ttft_ms},
                          {"decode_tokens_per_s", result->decode_tokens_per_s}};
    // Model output may be cut mid-character by max_tokens: replace rather than throw.
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "\n";
    std::cerr << absl::StrCat("[", result->prompt_tokens, " prompt tokens, ",
                              result->token_ids.size(), " generated, finish ",
                              result->finish_reason, ", TTFT ", result->ttft_ms, " ms, decode ",
                              result->decode_tokens_per_s, " tokens/s]\n");
  }
  return 0;
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << lazyattn::kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "generate") return lazyattn::Generate(argc, argv);
  std::cerr << "lazyattn: unknown command '" << command << "'\n" << lazyattn::kUsage;
  return 2;
}
