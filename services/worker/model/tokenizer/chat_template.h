// Chat templates implemented in C++ (no Jinja interpreter): the handful of formats we serve,
// reproducing the models' own Jinja templates byte for byte.
//
// Supported:
//   "chatml"   <|im_start|>{role}\n{content}<|im_end|>\n per message; generation prompt
//              <|im_start|>assistant\n.
//   "smollm2"  ChatML plus SmolLM2-Instruct's default system message ("You are a helpful AI
//              assistant named SmolLM, trained by Hugging Face"), inserted before the first message
//              when that message is not a system message (and not at all for an empty list).
//   "llama3"   Llama-3.0: <|begin_of_text|> before the first message, then per message
//              <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>; generation
//              prompt <|start_header_id|>assistant<|end_header_id|>\n\n.
//   "llama3.1" Llama-3.1/3.2/3.3 without tools: <|begin_of_text|>, an always-present system turn
//              "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n{system|trim}", then
//              the other messages as in "llama3". {date} is Options::date_string, else "26 Jul
//              2024" (3.1's default), or today's date ("%d %b %Y") for the 3.2+ templates that call
//              strftime_now. Tool calls / tool results are not supported (Unimplemented).
//
// FromJinja() recognizes a model's template (GGUF tokenizer.chat_template, tokenizer_config.json
// chat_template) by its markers: <|im_start|> -> ChatML (with the default system message
// extracted from a SmolLM2-style `messages[0]['role'] != 'system'` block; templates that also
// mention tools or thinking are refused rather than rendered wrongly); <|start_header_id|> and
// <|eot_id|> -> Llama-3, 3.1 form when it contains "Cutting Knowledge Date". A template with the
// markers of both families, and anything else, is Unimplemented. Errors never abort.
//
// The rendered prompt contains special-token text; tokenize it with parse_special=true. For
// Llama-3 the prompt already starts with <|begin_of_text|>, which Tokenizer::EncodeWithSpecials
// does not duplicate. Message contents are inserted verbatim: special-token text inside user
// content is not escaped (same as llama.cpp).
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_CHAT_TEMPLATE_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lazyattn {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { kChatML, kLlama3, kLlama31 };

  struct Options {
    bool add_generation_prompt = true;
    // Text of the BOS token that Llama-3 templates render ({{ bos_token }}).
    std::string bos_token = "<|begin_of_text|>";
    // Llama-3.1+: the "Today Date" line; empty means the template's default (see above).
    std::string date_string;
  };

  // "chatml", "smollm2", "llama3", "llama3.1" (fixed default date), "llama3.2" / "llama3.3"
  // (today's date by default). InvalidArgument for any other name.
  static absl::StatusOr<ChatTemplate> FromName(std::string_view name);
  // Recognizes a Jinja template; NotFound when empty, Unimplemented when unrecognized.
  static absl::StatusOr<ChatTemplate> FromJinja(std::string_view jinja);
  // `name` when non-empty, else FromJinja(jinja).
  static absl::StatusOr<ChatTemplate> Resolve(std::string_view name, std::string_view jinja);

  absl::StatusOr<std::string> Apply(absl::Span<const ChatMessage> messages,
                                    const Options& options) const;
  absl::StatusOr<std::string> Apply(absl::Span<const ChatMessage> messages,
                                    bool add_generation_prompt = true) const;

  Kind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  // ChatML's implicit system message; empty when none.
  const std::string& default_system_message() const { return default_system_; }

 private:
  ChatTemplate(Kind kind, std::string name) : kind_(kind), name_(std::move(name)) {}
  Kind kind_;
  std::string name_;
  std::string default_system_;
  bool date_defaults_to_today_ = false;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_CHAT_TEMPLATE_H_
