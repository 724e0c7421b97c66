// `lazyattn prefetch`: asks a router to warm workers with documents (Inference.Prefetch, which
// needs an API key with the `admin` scope). Prints the workers and token counts as JSON.
//
//   lazyattn prefetch --router HOST:PORT --doc FILE... [--replicas N] [--ca F] [--api-key K]
#include <chrono>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "lazyattn/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tools/cli/cli_args.h"
#include "tools/cli/commands.h"
#include "tools/cli/doc_files.h"
#include "tools/cli/router_channel.h"

namespace lazyattn {

int PrefetchCommand(int argc, char** argv) {
  CliArgs args;
  args.Declare("router", CliArgs::Kind::kValue, "the router's HOST:PORT");
  DeclareRouterSecurityFlags(args);
  DeclareDocFlags(args, "a document file (repeatable)");
  args.Declare("replicas", CliArgs::Kind::kValue, "workers to warm (default 0: the router's pick)");
  args.Declare("cache-salt", CliArgs::Kind::kValue,
               "warm the cache of requests with this salt (and this API key's namespace)");
  args.Declare("timeout", CliArgs::Kind::kValue, "deadline in seconds (default 120)");
  args.Declare("help", CliArgs::Kind::kSwitch, "show this help");
  if (absl::Status s = args.Parse(argc, argv, 2); !s.ok()) {
    std::cerr << "lazyattn prefetch: " << s.message() << "\n" << args.Help();
    return 2;
  }
  if (args.Has("help")) {
    std::cout << "lazyattn prefetch flags:\n" << args.Help();
    return 0;
  }
  const auto replicas = args.Int("replicas", 0);
  const auto timeout = args.Int("timeout", 120);
  if (!args.Has("router") || args.Strings("doc").empty() || !replicas.ok() || !timeout.ok() ||
      *timeout <= 0) {
    std::cerr << "lazyattn prefetch: --router and --doc are required\n" << args.Help();
    return 2;
  }
  v1::PrefetchRequest request;
  request.set_replicas(static_cast<int32_t>(*replicas));
  request.set_cache_salt(args.String("cache-salt"));
  auto docs = ReadDocFiles(args);
  if (!docs.ok()) return CliFail(docs.status(), 2);
  const std::vector<std::string> paths = args.Strings("doc");
  for (size_t i = 0; i < paths.size(); ++i) {
    v1::Document* d = request.add_documents();
    d->set_id(paths[i]);
    d->set_text(std::move((*docs)[i]));
  }
  auto channel = MakeRouterChannel(args, args.String("router"));
  if (!channel.ok()) return CliFail(channel.status(), 2);
  auto stub = v1::Inference::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(*timeout));
  v1::PrefetchResponse response;
  const grpc::Status status = stub->Prefetch(&context, request, &response);
  if (!status.ok()) {
    std::cerr << "lazyattn prefetch: " << status.error_message() << " (code "
              << status.error_code() << ")\n";
    return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 2 : 1;
  }
  nlohmann::json j = {{"workers", std::vector<std::string>(response.workers().begin(),
                                                           response.workers().end())},
                      {"computed_tokens", response.computed_tokens()},
                      {"cached_tokens", response.cached_tokens()}};
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace lazyattn
