// `lazyattn replay`: many requests through one engine, so they share its caches; reports each
// request's cache hits and TTFT, and the totals.
//
// --requests FILE.jsonl, one request per line:
//   {"system": "...", "documents": ["text", {"id": "d1", "text": "..."}, {"token_ids": [1, 2]}],
//    "question": "...", "mode": "lazy", "max_tokens": 32}
// Fields other than "question" are optional; flags give the defaults.
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/blocking_counter.h"
#include "nlohmann/json.hpp"
#include "tools/cli/cli_engine.h"
#include "tools/cli/commands.h"

namespace lazyattn {
namespace {

using nlohmann::json;

absl::StatusOr<EngineRequest> ParseLine(const json& j, int line, const Tokenizer& tokenizer,
                                        bool chat, CacheMode default_mode,
                                        const SamplingParams& default_sampling) {
  auto bad = [line](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
  };
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("question") || !j["question"].is_string()) return bad("\"question\" (string) missing");
  const std::string system = j.value("system", std::string());
  const bool has_documents = j.contains("documents") && j["documents"].is_array() && !j["documents"].empty();
  auto parts = BuildPrompt(tokenizer, chat, system, j["question"].get<std::string>(), has_documents);
  if (!parts.ok()) return parts.status();
  EngineRequest r{.system_prefix = parts->system_prefix, .question = parts->question,
                  .mode = default_mode, .sampling = default_sampling};
  if (j.contains("mode")) {
    if (!j["mode"].is_string()) return bad("\"mode\" must be a string");
    auto mode = ParseCacheMode(j["mode"].get<std::string>());
    if (!mode.ok()) return bad(std::string(mode.status().message()));
    r.mode = *mode;
  }
  if (j.contains("max_tokens")) {
    if (!j["max_tokens"].is_number_integer()) return bad("\"max_tokens\" must be an integer");
    r.sampling.max_tokens = j["max_tokens"].get<int>();
  }
  if (j.contains("documents")) {
    if (!j["documents"].is_array()) return bad("\"documents\" must be an array");
    int i = 0;
    for (const json& d : j["documents"]) {
      EngineDocument doc;
      if (d.is_string()) {
        doc.text = d.get<std::string>();
      } else if (d.is_object()) {
        doc.id = d.value("id", std::string());
        if (d.contains("token_ids")) {
          if (!d["token_ids"].is_array()) return bad(absl::StrCat("documents[", i, "].token_ids must be an array"));
          std::vector<int32_t> ids;
          for (const json& t : d["token_ids"]) {
            if (!t.is_number_integer()) return bad(absl::StrCat("documents[", i, "].token_ids must hold integers"));
            ids.push_back(t.get<int32_t>());
          }
          doc.token_ids = std::move(ids);
        } else if (d.contains("text") && d["text"].is_string()) {
          doc.text = d["text"].get<std::string>();
        } else {
          return bad(absl::StrCat("documents[", i, "] needs \"text\" or \"token_ids\""));
        }
      } else {
        return bad(absl::StrCat("documents[", i, "] must be a string or an object"));
      }
      r.documents.push_back(std::move(doc));
      ++i;
    }
  }
  return r;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int ReplayCommand(int argc, char** argv) {
  CliArgs args;
  args.Declare("model", CliArgs::Kind::kValue, "a .gguf file or an HF model directory");
  args.Declare("requests", CliArgs::Kind::kValue, "JSONL file, one request per line");
  args.Declare("chat", CliArgs::Kind::kSwitch, "wrap each question in the chat template");
  args.Declare("mode", CliArgs::Kind::kValue, "default cache mode (default lazy)");
  DeclareBackendFlags(args);
  args.Declare("concurrency", CliArgs::Kind::kValue, "requests in flight at once (default 1)");
  args.Declare("json", CliArgs::Kind::kSwitch, "one JSON line per request, then a summary line");
  args.Declare("help", CliArgs::Kind::kSwitch, "show this help");
  DeclareSamplingFlags(args);
  if (absl::Status s = args.Parse(argc, argv, 2); !s.ok()) {
    std::cerr << "lazyattn replay: " << s.message() << "\n" << args.Help();
    return 2;
  }
  if (args.Has("help")) {
    std::cout << "lazyattn replay flags:\n" << args.Help();
    return 0;
  }
  if (!args.Has("model") || !args.Has("requests")) {
    std::cerr << "lazyattn replay: --model and --requests are required\n" << args.Help();
    return 2;
  }
  auto sampling = SamplingFromArgs(args);
  auto mode = ParseCacheMode(args.String("mode", "lazy"));
  auto concurrency = args.Int("concurrency", 1);
  for (const absl::Status& s : {sampling.status(), mode.status(),
                                concurrency.status()}) {
    if (!s.ok()) return CliFail(s, 2);
  }
  if (*concurrency < 1) return CliFail(absl::InvalidArgumentError("--concurrency must be >= 1"), 2);

  int load_exit = 0;
  auto model = ServedModelFromArgs(args, &load_exit);
  if (!model.ok()) return CliFail(model.status(), load_exit);
  const std::string requests_path = args.String("requests");
  // A file or a pipe (`--requests <(cmd)`): a directory read as no requests and exited 0, and
  // /dev/zero (no newline, ever) was read until memory ran out.
  struct stat st {};
  if (stat(requests_path.c_str(), &st) != 0) {
    return CliFail(absl::NotFoundError("--requests: cannot read " + requests_path), 2);
  }
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    return CliFail(absl::InvalidArgumentError(
                       absl::StrCat("--requests: ", requests_path, " is not a file or a pipe")),
                   2);
  }
  std::ifstream in(requests_path);
  if (!in) return CliFail(absl::NotFoundError("--requests: cannot read " + requests_path), 2);
  std::vector<EngineRequest> requests;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return CliFail(absl::InvalidArgumentError(absl::StrCat("line ", n, ": invalid JSON")), 2);
    auto r = ParseLine(j, n, *model->tokenizer, args.Has("chat"), *mode, *sampling);
    if (!r.ok()) return CliFail(r.status(), 2);
    requests.push_back(std::move(*r));
  }
  if (in.bad()) {
    return CliFail(absl::DataLossError("--requests: error reading " + requests_path), 2);
  }
  if (requests.empty()) {
    return CliFail(
        absl::InvalidArgumentError("--requests: " + requests_path + " holds no requests"), 2);
  }

  const std::unique_ptr<Engine> engine_ptr = EngineFor(*model);
  Engine& engine = *engine_ptr;
  const bool as_json = args.Has("json");
  std::mutex mu;
  std::vector<double> ttfts;
  int64_t failures = 0, docs = 0, docs_hit = 0, prompt_tokens = 0, cached_tokens = 0;
  const absl::Time start = absl::Now();
  if (!as_json) {
    std::cout << "| # | mode | docs hit | prompt tokens | cached | TTFT ms | tokens | status |\n"
                 "|---|---|---|---|---|---|---|---|\n";
  }
  // Requests go out in order with at most `concurrency` in flight.
  size_t next = 0;
  auto worker = [&] {
    while (true) {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= requests.size()) return;
        i = next++;
      }
      absl::BlockingCounter done(1);
      RequestCallbacks cb{.on_done = [&, i](const absl::Status& s, const RequestResult& r) {
        std::lock_guard<std::mutex> lock(mu);
        if (!s.ok()) ++failures;
        ttfts.push_back(r.ttft_ms);
        docs += r.usage.documents;
        docs_hit += r.usage.documents_hit;
        prompt_tokens += r.usage.prompt_tokens;
        cached_tokens += r.usage.cached_tokens;
        if (as_json) {
          json j = ResultJson(r, args.String("model"), requests[i].mode);
          j["index"] = i;
          j["status"] = s.ok() ? "OK" : std::string(s.message());
          std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
        } else {
          std::cout << absl::StrFormat("| %d | %s | %d/%d | %d | %d | %.1f | %d | %s |\n", i,
                                       std::string(CacheModeName(requests[i].mode)),
                                       r.usage.documents_hit, r.usage.documents,
                                       r.usage.prompt_tokens, r.usage.cached_tokens, r.ttft_ms,
                                       r.token_ids.size(), s.ok() ? "ok" : std::string(s.message()));
        }
        done.DecrementCount();
      }};
      auto id = engine.Submit(requests[i], std::move(cb));
      if (!id.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++failures;
        std::cout << "request " << i << ": " << id.status().message() << "\n";
        continue;
      }
      done.Wait();
    }
  };
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < *concurrency; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  json summary = {{"summary", true},
                  {"requests", requests.size()},
                  {"failures", failures},
                  {"documents", docs},
                  {"documents_hit", docs_hit},
                  {"prompt_tokens", prompt_tokens},
                  {"cached_tokens", cached_tokens},
                  {"cached_token_ratio", prompt_tokens ? double(cached_tokens) / prompt_tokens : 0.0},
                  {"ttft_ms_p50", Percentile(ttfts, 0.5)},
                  {"ttft_ms_p99", Percentile(ttfts, 0.99)},
                  {"seconds", seconds}};
  if (as_json) {
    std::cout << summary.dump() << "\n";
  } else {
    std::cout << absl::StrFormat(
        "\n%d requests in %.2f s, %d failed; documents hit %d/%d; prompt tokens cached %d/%d "
        "(%.1f%%); TTFT p50 %.1f ms, p99 %.1f ms\n",
        requests.size(), seconds, failures, docs_hit, docs, cached_tokens, prompt_tokens,
        prompt_tokens ? 100.0 * cached_tokens / prompt_tokens : 0.0, Percentile(ttfts, 0.5),
        Percentile(ttfts, 0.99));
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace lazyattn
