#include "services/router/http/openai_response_json.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::Final;
using nlohmann::json;

json UsageJson(const lazyattn::v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
}

json ExtensionJson(const Final& final) {
  return {{"documents", final.usage().documents()},
          {"documents_hit", final.usage().documents_hit()},
          {"computed_tokens", final.usage().computed_tokens()},
          {"worker", final.worker()},
          {"attempts", final.attempts()},
          {"ttft_ms", final.ttft_ms()}};
}

std::string Dump(const json& j) {
  // Token text is UTF-8 from the worker; replace rather than throw if it ever is not.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json Envelope(const ResponseMeta& meta, bool chunk) {
  const char* object = meta.kind == ApiKind::kChat
                           ? (chunk ? "chat.completion.chunk" : "chat.completion")
                           : "text_completion";
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

json ChunkChoice(const ResponseMeta& meta, int index, const std::string* text, bool role,
                 const char* finish_reason, const json* logprobs = nullptr) {
  json choice = {{"index", index}, {"logprobs", logprobs != nullptr ? *logprobs : json(nullptr)}};
  if (meta.kind == ApiKind::kChat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (text != nullptr) delta["content"] = *text;
    if (role && text == nullptr) delta["content"] = "";
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text != nullptr ? *text : std::string();
  }
  choice["finish_reason"] = finish_reason != nullptr ? json(finish_reason) : json(nullptr);
  return choice;
}

}  // namespace

const char* OpenAiFinishReason(std::string_view worker_reason) {
  return worker_reason == "length" ? "length" : "stop";
}

lazyattn::v1::Usage CombinedUsage(std::span<const Final> finals) {
  lazyattn::v1::Usage usage;
  if (finals.empty()) return usage;
  usage = finals.front().usage();
  for (const Final& f : finals.subspan(1)) {
    usage.set_completion_tokens(usage.completion_tokens() + f.usage().completion_tokens());
  }
  return usage;
}

std::string CompletionJson(const ResponseMeta& meta, std::span<const ChoiceResult> choices) {
  json list = json::array();
  std::vector<Final> finals;
  finals.reserve(choices.size());
  for (size_t i = 0; i < choices.size(); ++i) {
    const Final& final = *choices[i].final;
    finals.push_back(final);
    json choice = {{"index", i}, {"finish_reason", OpenAiFinishReason(final.finish_reason())}};
    // The object's keys are sorted whatever the order they are set in.
    if (choices[i].logprobs != nullptr) {
      choice["logprobs"] = *choices[i].logprobs;
    } else if (choices[i].make_logprobs) {
      choice["logprobs"] = choices[i].make_logprobs();  // moved in: built once, held once
    } else {
      choice["logprobs"] = nullptr;
    }
    if (meta.kind == ApiKind::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", final.text()}};
    } else {
      choice["text"] = meta.echo.empty() ? final.text() : absl::StrCat(meta.echo, final.text());
    }
    if (choices.size() > 1) choice["lazyattn"] = ExtensionJson(final);
    list.push_back(std::move(choice));
  }
  json j = Envelope(meta, /*chunk=*/false);
  j["choices"] = std::move(list);
  j["usage"] = UsageJson(CombinedUsage(finals));
  if (!finals.empty()) j["lazyattn"] = ExtensionJson(finals.front());
  return Dump(j);
}

std::string RoleChunkJson(const ResponseMeta& meta, int choice, bool include_usage) {
  json j = Envelope(meta, true);
  j["choices"] = json::array({ChunkChoice(meta, choice, nullptr, /*role=*/true, nullptr)});
  if (include_usage) j["usage"] = nullptr;
  return Dump(j);
}

std::string TextChunkJson(const ResponseMeta& meta, int choice, const std::string& text,
                          bool include_usage, const json* logprobs) {
  json j = Envelope(meta, true);
  j["choices"] = json::array({ChunkChoice(meta, choice, &text, false, nullptr, logprobs)});
  if (include_usage) j["usage"] = nullptr;
  return Dump(j);
}

std::string FinishChunkJson(const ResponseMeta& meta, int choice, const Final& final,
                            bool include_usage) {
  json j = Envelope(meta, true);
  json c = ChunkChoice(meta, choice, nullptr, false, OpenAiFinishReason(final.finish_reason()));
  if (meta.kind == ApiKind::kCompletion) c["text"] = "";
  j["choices"] = json::array({std::move(c)});
  if (include_usage) j["usage"] = nullptr;
  j["lazyattn"] = ExtensionJson(final);
  return Dump(j);
}

std::string UsageChunkJson(const ResponseMeta& meta, std::span<const Final> finals) {
  json j = Envelope(meta, true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(CombinedUsage(finals));
  return Dump(j);
}

}  // namespace lazyattn::router
