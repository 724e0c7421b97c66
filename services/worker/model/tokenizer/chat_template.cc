#include "services/worker/model/tokenizer/chat_template.h"

#include <ctime>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "services/worker/model/tokenizer/unicode.h"

namespace lazyattn {
namespace {

// Debian's Abseil has its own absl::string_view (not std::string_view); convert explicitly.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr char kSmolLM2System[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
constexpr char kLlama31DefaultDate[] = "26 Jul 2024";

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// Python's str.strip() (Jinja's |trim): Unicode White_Space plus U+001C..U+001F.
bool IsPythonSpace(uint32_t cp) { return IsWhitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

std::string_view Trim(std::string_view s) {
  size_t begin = 0;
  size_t end = 0;  // end of the last non-space code point
  bool seen = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const uint32_t cp = DecodeUtf8Lenient(s, &pos);
    if (!IsPythonSpace(cp)) {
      if (!seen) begin = start;
      seen = true;
      end = pos;
    }
  }
  return seen ? s.substr(begin, end - begin) : std::string_view();
}

std::string TodayDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
  return std::string(buf, n);
}

// The literal system message of a SmolLM2-style ChatML template:
//   {% if loop.first and messages[0]['role'] != 'system' %}
//   {{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}{% endif %}
// Returns "" when the template has no such block.
std::string ExtractChatMLDefaultSystem(std::string_view jinja) {
  size_t cond = std::string_view::npos;
  for (std::string_view c :
       {"messages[0]['role'] != 'system'", "messages[0][\"role\"] != \"system\"",
        "messages[0].role != 'system'", "messages[0].role != \"system\""}) {
    cond = std::min(cond, jinja.find(c));
  }
  if (cond == std::string_view::npos) return "";
  const std::string_view open = "<|im_start|>system";
  const size_t start = jinja.find(open, cond);
  const size_t endif = jinja.find("endif", cond);
  if (start == std::string_view::npos || (endif != std::string_view::npos && endif < start)) {
    return "";
  }
  size_t body = start + open.size();
  if (jinja.substr(body, 1) == "\n") {
    body += 1;
  } else if (jinja.substr(body, 2) == "\\n") {
    body += 2;
  } else {
    return "";
  }
  const size_t stop = jinja.find("<|im_end|>", body);
  if (stop == std::string_view::npos) return "";
  const std::string_view text = jinja.substr(body, stop - body);
  // Only a plain literal: anything that looks like Jinja means we are not looking at one.
  if (Contains(text, "{") || Contains(text, "}") || Contains(text, "' +") ||
      Contains(text, "\" +")) {
    return "";
  }
  return absl::StrReplaceAll(Sv(text), {{"\\n", "\n"}, {"\\'", "'"}, {"\\\"", "\""}});
}

void AppendLlama3Turn(std::string_view role, std::string_view content, std::string* out) {
  absl::StrAppend(out, "<|start_header_id|>", Sv(role), "<|end_header_id|>\n\n", Sv(content),
                  "<|eot_id|>");
}

constexpr char kLlama3GenerationPrompt[] = "<|start_header_id|>assistant<|end_header_id|>\n\n";

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromName(std::string_view name) {
  if (name == "chatml") return ChatTemplate(Kind::kChatML, "chatml");
  if (name == "smollm2") {
    ChatTemplate t(Kind::kChatML, "smollm2");
    t.default_system_ = kSmolLM2System;
    return t;
  }
  if (name == "llama3") return ChatTemplate(Kind::kLlama3, "llama3");
  if (name == "llama3.1") return ChatTemplate(Kind::kLlama31, "llama3.1");
  if (name == "llama3.2" || name == "llama3.3") {
    ChatTemplate t(Kind::kLlama31, std::string(name));
    t.date_defaults_to_today_ = true;
    return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chat template \"", Sv(name),
                   "\"; supported: chatml, smollm2, llama3, llama3.1, llama3.2, llama3.3"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja) {
  if (jinja.empty()) {
    return absl::NotFoundError("the model has no chat template; name one explicitly");
  }
  const bool chatml = Contains(jinja, "<|im_start|>");
  const bool llama3 = Contains(jinja, "<|start_header_id|>") && Contains(jinja, "<|eot_id|>");
  if (chatml && llama3) {
    // Which family a template that writes both markers renders is decided by its logic, which
    // this worker does not evaluate; guessing would give the model a prompt it was not trained
    // on, every turn, without a word.
    return absl::UnimplementedError(
        "chat template contains both ChatML (<|im_start|>) and Llama-3 (<|start_header_id|>, "
        "<|eot_id|>) markers, and which it renders depends on logic this worker does not "
        "evaluate; give the model (tokenizer_config.json chat_template, or the GGUF's "
        "tokenizer.chat_template) a template of one family");
  }
  if (chatml) {
    for (std::string_view marker : {"tools", "tool_call", "enable_thinking", "reasoning_content"}) {
      if (Contains(jinja, marker)) {
        return absl::UnimplementedError(absl::StrCat(
            "ChatML chat template uses \"", Sv(marker),
            "\", which is not supported; give the model a plain ChatML template "
            "(tokenizer_config.json chat_template, or the GGUF's tokenizer.chat_template)"));
      }
    }
    std::string system = ExtractChatMLDefaultSystem(jinja);
    ChatTemplate t(Kind::kChatML, system == kSmolLM2System ? "smollm2" : "chatml");
    t.default_system_ = std::move(system);
    return t;
  }
  if (llama3) {
    if (Contains(jinja, "Cutting Knowledge Date")) {
      const bool today = Contains(jinja, "strftime_now");
      ChatTemplate t(Kind::kLlama31, today ? "llama3.2" : "llama3.1");
      t.date_defaults_to_today_ = today;
      return t;
    }
    return ChatTemplate(Kind::kLlama3, "llama3");
  }
  return absl::UnimplementedError(absl::StrCat(
      "unrecognized chat template (supported: ChatML, Llama-3, Llama-3.1+); it starts with \"",
      Sv(jinja.substr(0, 80)), "\""));
}

absl::StatusOr<ChatTemplate> ChatTemplate::Resolve(std::string_view name, std::string_view jinja) {
  if (!name.empty()) return FromName(name);
  return FromJinja(jinja);
}

absl::StatusOr<std::string> ChatTemplate::Apply(absl::Span<const ChatMessage> messages,
                                                bool add_generation_prompt) const {
  Options options;
  options.add_generation_prompt = add_generation_prompt;
  return Apply(messages, options);
}

absl::StatusOr<std::string> ChatTemplate::Apply(absl::Span<const ChatMessage> messages,
                                                const Options& options) const {
  std::string out;
  switch (kind_) {
    case Kind::kChatML: {
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0 && !default_system_.empty() && messages[0].role != "system") {
          absl::StrAppend(&out, "<|im_start|>system\n", default_system_, "<|im_end|>\n");
        }
        absl::StrAppend(&out, "<|im_start|>", messages[i].role, "\n", messages[i].content,
                        "<|im_end|>\n");
      }
      if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    }
    case Kind::kLlama3: {
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0) out += options.bos_token;
        AppendLlama3Turn(messages[i].role, Trim(messages[i].content), &out);
      }
      if (options.add_generation_prompt) out += kLlama3GenerationPrompt;
      return out;
    }
    case Kind::kLlama31: {
      if (messages.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat template ", name_, " needs at least one message"));
      }
      size_t first = 0;
      std::string_view system;
      if (messages[0].role == "system") {
        system = Trim(messages[0].content);
        first = 1;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        if (messages[i].role == "tool" || messages[i].role == "ipython") {
          return absl::UnimplementedError(absl::StrCat("chat template ", name_,
                                                       ": tool messages (role \"", messages[i].role,
                                                       "\") are not supported"));
        }
      }
      std::string date = options.date_string;
      if (date.empty()) date = date_defaults_to_today_ ? TodayDate() : kLlama31DefaultDate;
      absl::StrAppend(&out, options.bos_token, "<|start_header_id|>system<|end_header_id|>\n\n",
                      "Cutting Knowledge Date: December 2023\n", "Today Date: ", date, "\n\n",
                      Sv(system), "<|eot_id|>");
      for (size_t i = first; i < messages.size(); ++i) {
        AppendLlama3Turn(messages[i].role, Trim(messages[i].content), &out);
      }
      if (options.add_generation_prompt) out += kLlama3GenerationPrompt;
      return out;
    }
  }
  return absl::InternalError("unknown chat template kind");
}

}  // namespace lazyattn
