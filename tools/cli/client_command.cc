// `lazyattn client`: one request to a cluster's router over gRPC (lazyattn.v1.Inference), with the
// same flags as `generate`; the text streams to stdout.
#include <grpcpp/grpcpp.h>

#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tools/cli/cli_engine.h"
#include "tools/cli/client_common.h"
#include "tools/cli/commands.h"
#include "tools/cli/doc_files.h"
#include "tools/cli/router_channel.h"

namespace lazyattn {

v1::CacheMode ToProtoMode(CacheMode m) {
  switch (m) {
    case CacheMode::kFull: return v1::CACHE_MODE_FULL;
    case CacheMode::kPrefix: return v1::CACHE_MODE_PREFIX;
    case CacheMode::kBlock: return v1::CACHE_MODE_BLOCK;
    case CacheMode::kLazy: return v1::CACHE_MODE_LAZY;
  }
  return v1::CACHE_MODE_UNSPECIFIED;
}

int ClientCommand(int argc, char** argv) {
  CliArgs args;
  args.Declare("router", CliArgs::Kind::kValue, "the router's HOST:PORT");
  DeclareRouterSecurityFlags(args);
  args.Declare("prompt", CliArgs::Kind::kValue, "the question (the user message with --chat)");
  args.Declare("chat", CliArgs::Kind::kSwitch, "apply the model's chat template (on the worker)");
  args.Declare("system", CliArgs::Kind::kValue, "system text before the documents");
  DeclareDocFlags(args, "a document file, placed before the question");
  args.Declare("mode", CliArgs::Kind::kValue, "cache mode: full, prefix, block or lazy (default)");
  args.Declare("cache-salt", CliArgs::Kind::kValue,
               "share cached KV only with requests of this salt (and this API key's namespace)");
  args.Declare("served-model", CliArgs::Kind::kValue,
               "the model to ask for (GenerateRequest.model: a name, an id or name@fingerprint); "
               "default: the router's only model");
  args.Declare("timeout", CliArgs::Kind::kValue, "deadline in seconds (default 120)");
  args.Declare("json", CliArgs::Kind::kSwitch, "print the final message as JSON");
  args.Declare("help", CliArgs::Kind::kSwitch, "show this help");
  DeclareSamplingFlags(args);
  if (absl::Status s = args.Parse(argc, argv, 2); !s.ok()) {
    std::cerr << "lazyattn client: " << s.message() << "\n" << args.Help();
    return 2;
  }
  if (args.Has("help")) {
    std::cout << "lazyattn client flags:\n" << args.Help();
    return 0;
  }
  if (!args.Has("router") || !args.Has("prompt")) {
    std::cerr << "lazyattn client: --router and --prompt are required\n" << args.Help();
    return 2;
  }
  auto sampling = SamplingFromArgs(args);
  auto mode = ParseCacheMode(args.String("mode", "lazy"));
  auto timeout = args.Double("timeout", 120);
  for (const absl::Status& s : {sampling.status(), mode.status(), timeout.status()}) {
    if (!s.ok()) return CliFail(s, 2);
  }
  v1::GenerateRequest request;
  request.set_system(args.String("system"));
  request.set_question(args.String("prompt"));
  request.set_chat(args.Has("chat"));
  request.set_cache_mode(ToProtoMode(*mode));
  request.set_model(args.String("served-model"));
  request.set_cache_salt(args.String("cache-salt"));
  auto docs = ReadDocFiles(args);
  if (!docs.ok()) return CliFail(docs.status(), 2);
  const std::vector<std::string> paths = args.Strings("doc");
  for (size_t i = 0; i < paths.size(); ++i) {
    v1::Document* d = request.add_documents();
    d->set_id(paths[i]);
    d->set_text(std::move((*docs)[i]));
  }
  v1::SamplingParams* sp = request.mutable_sampling();
  sp->set_temperature(sampling->temperature);
  sp->set_top_k(sampling->top_k);
  sp->set_top_p(sampling->top_p);
  if (sampling->seed) sp->set_seed(*sampling->seed);  // unset: the worker draws a fresh one
  sp->set_max_tokens(sampling->max_tokens);
  for (const auto& s : sampling->stop) sp->add_stop(s);
  sp->set_ignore_eos(sampling->ignore_eos);
  sp->set_min_p(sampling->min_p);
  sp->set_repetition_penalty(sampling->repetition_penalty);
  sp->set_presence_penalty(sampling->presence_penalty);
  sp->set_frequency_penalty(sampling->frequency_penalty);
  sp->set_logprobs(sampling->logprobs);
  sp->set_top_logprobs(sampling->top_logprobs);

  auto channel = MakeRouterChannel(args, args.String("router"));
  if (!channel.ok()) return CliFail(channel.status());
  auto stub = v1::Inference::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000)));
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  v1::Final final;
  std::vector<int32_t> token_ids;  // the text alone can hide differences (U+FFFD replacements)
  std::vector<float> logprobs;     // with --logprobs
  nlohmann::json top_logprobs = nlohmann::json::array();  // with --top-logprobs N
  const bool json = args.Has("json");
  while (reader->Read(&response)) {
    // A last chunk may carry only text the worker held back (token_id -1: an incomplete UTF-8
    // sequence at the end); it is no token, so it adds to the text but not to the token lists.
    if (response.has_token() && response.token().token_id() >= 0) {
      token_ids.push_back(response.token().token_id());
      if (response.token().has_logprob()) logprobs.push_back(response.token().logprob());
      if (sampling->top_logprobs > 0) {
        nlohmann::json& entries = top_logprobs.emplace_back(nlohmann::json::array());
        for (const v1::TopLogprob& t : response.token().top_logprobs()) {
          entries.push_back({{"id", t.token_id()}, {"logprob", t.logprob()}});
        }
      }
    }
    if (response.has_token() && !json) std::cout << response.token().text() << std::flush;
    if (response.has_final()) final = response.final();
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    std::cerr << "\nlazyattn client: " << status.error_message() << " (code "
              << status.error_code() << ")\n";
    return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 2 : 1;
  }
  const v1::Usage& u = final.usage();
  if (json) {
    nlohmann::json out = {{"text", final.text()},
                          {"token_ids", token_ids},
                          {"finish_reason", final.finish_reason()},
                          {"worker", final.worker()},
                          {"attempts", final.attempts()},
                          {"ttft_ms", final.ttft_ms()},
                          {"prompt_tokens", u.prompt_tokens()},
                          {"cached_tokens", u.cached_tokens()},
                          {"computed_tokens", u.computed_tokens()},
                          {"completion_tokens", u.completion_tokens()},
                          {"documents", u.documents()},
                          {"documents_hit", u.documents_hit()}};
    if (sampling->logprobs) out["logprobs"] = logprobs;
    if (sampling->top_logprobs > 0) out["top_logprobs"] = std::move(top_logprobs);
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << std::endl;
    std::cerr << absl::StrCat("[worker ", final.worker(), ", documents hit ", u.documents_hit(),
                              "/", u.documents(), ", ", u.cached_tokens(), "/", u.prompt_tokens(),
                              " prompt tokens cached, TTFT ", final.ttft_ms(), " ms]\n");
  }
  return 0;
}

}  // namespace lazyattn
