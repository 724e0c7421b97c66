// `lazyattn`: the command-line front end of the engine.
//
//   lazyattn generate --model PATH --prompt TEXT [--chat] [--system TEXT] [--doc FILE]...
//                     [--mode full|prefix|block|lazy] [--backend cpu|cuda|auto]
//                     [--kv-budget BYTES] [--max-tokens N]
//                     [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]
//                     [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]
//                     [--stop STR]... [--ignore-eos] [--logprobs] [--top-logprobs N] [--json]
//   lazyattn replay --model PATH --requests FILE.jsonl [--mode M] [--backend B]
//                   [--kv-budget BYTES] [generate's sampling flags] [--json]
//   lazyattn client --router HOST:PORT --prompt TEXT [generate's flags but --model] [--timeout S]
//   lazyattn trace --router HOST:PORT [--requests N] [--rate R] [--dist zipf:A|uniform] ...
//
// Exit status: 0 on success, 2 for a usage error or a --model that is missing, malformed or
// unsupported (the message names the file and the field), 1 otherwise.
#include <iostream>
#include <string>

#include "tools/cli/commands.h"

namespace lazyattn {

int CliFail(const absl::Status& status, int code) {
  std::cerr << "lazyattn: " << status.message() << "\n";
  return code;
}

nlohmann::json ResultJson(const RequestResult& r, const std::string& model, CacheMode mode) {
  nlohmann::json j = {{"model", model},
                      {"mode", std::string(CacheModeName(mode))},
                      {"token_ids", r.token_ids},
                      {"text", r.text},
                      {"finish_reason", r.finish_reason},
                      {"prompt_tokens", r.usage.prompt_tokens},
                      {"cached_tokens", r.usage.cached_tokens},
                      {"computed_tokens", r.usage.computed_tokens},
                      {"documents", r.usage.documents},
                      {"documents_hit", r.usage.documents_hit},
                      {"completion_tokens", r.usage.completion_tokens},
                      {"ttft_ms", r.ttft_ms},
                      {"decode_tokens_per_s", r.decode_tokens_per_s},
                      {"preemptions", r.preemptions}};
  if (!r.logprobs.empty()) j["logprobs"] = r.logprobs;  // with --logprobs
  if (!r.top_logprobs.empty()) {  // with --top-logprobs N: [[{"id", "logprob"}, ...], ...]
    nlohmann::json& all = j["top_logprobs"] = nlohmann::json::array();
    for (const std::vector<TopLogprob>& position : r.top_logprobs) {
      nlohmann::json& entries = all.emplace_back(nlohmann::json::array());
      for (const TopLogprob& t : position)
        entries.push_back({{"id", t.token_id}, {"logprob", t.logprob}});
    }
  }
  return j;
}

}  // namespace lazyattn

namespace {

constexpr char kUsage[] =
    "usage: lazyattn COMMAND [flags]\n"
    "commands:\n"
    "  generate   answer --prompt (optionally over --doc files) with the model at --model\n"
    "  replay     run a JSONL file of requests through one engine and report cache hits\n"
    "  client     send one request to a cluster's router (lazyattn.v1.Inference)\n"
    "  prefetch   warm workers with documents through a router (needs an admin API key)\n"
    "  trace      replay a Poisson trace of RAG requests against a router; report TTFT and hits\n"
    "  health     ask a kvdir, router or worker for its grpc.health.v1 status (exit 0: SERVING)\n"
    "run `lazyattn COMMAND --help` for the flags of a command\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "generate") return lazyattn::GenerateCommand(argc, argv);
  if (command == "replay") return lazyattn::ReplayCommand(argc, argv);
  if (command == "client") return lazyattn::ClientCommand(argc, argv);
  if (command == "trace") return lazyattn::TraceCommand(argc, argv);
  if (command == "health") return lazyattn::HealthCommand(argc, argv);
  if (command == "prefetch") return lazyattn::PrefetchCommand(argc, argv);
  std::cerr << "lazyattn: unknown command '" << command << "'\n" << kUsage;
  return 2;
}
