// Chat prompts from fuzzed system, question and document texts, with a fuzzed template: one of the
// named ones, one recognized from a model-style Jinja text, or fuzzed Jinja text. Besides not
// crashing, it checks:
//   - Apply renders every ChatML message's content verbatim;
//   - BuildPrompt's cut is a cut: system_prefix + documents + question is the template applied to
//     the documents and question as one user message (when that content starts with a letter, so
//     that Llama-3's trim of the content's start does not apply);
//   - the prompt tokenized as parts (Tokenizer::EncodeParts, documents literal, what modes full and
//     prefix feed the model) equals the rendered whole tokenized as one text, when no document
//     holds special-token text.
//
// Framing: byte 0 the template choice, byte 1 flags (bit 0 a system message, bit 1 add the
// generation prompt, bits 2-3 the number of documents), then length-prefixed texts: system,
// question, the documents, and the Jinja text for a fuzzed template (each at most 512 bytes).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "services/worker/engine/chat_prompt.h"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/tokenizer/chat_template.h"
#include "services/worker/model/tokenizer/tokenizer.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using lazyattn::ChatMessage;
using lazyattn::ChatTemplate;
using lazyattn::Tokenizer;

void Check(bool ok) {
  if (!ok) std::abort();
}

// The tiny model's vocabulary (ChatML specials included), loaded once and never changed.
const lazyattn::TokenizerSpec* TinySpec() {
  static const lazyattn::TokenizerSpec* const spec = [] {
    auto gguf = lazyattn::GgufFile::Open("tests/data/tiny/tiny-llama/tiny-llama-f32.gguf");
    if (!gguf.ok()) return static_cast<lazyattn::TokenizerSpec*>(nullptr);
    auto s = lazyattn::TokenizerSpecFromGguf(**gguf);
    return s.ok() ? new lazyattn::TokenizerSpec(*std::move(s)) : nullptr;
  }();
  return spec;
}

// Model-style templates, recognized by their markers (chat_template.h).
constexpr std::string_view kJinja[] = {
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}",
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}",
    "{{ bos_token }}<|start_header_id|>{{ role }}<|end_header_id|>\n\n{{ content | trim }}"
    "<|eot_id|>",
    "Cutting Knowledge Date: December 2023 <|start_header_id|> <|eot_id|>",
};
constexpr std::string_view kNames[] = {"chatml", "smollm2", "llama3", "llama3.1"};

std::string Text(lazyattn::fuzz::FuzzInput& in) { return in.Bytes(in.Range(0, 512)); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lazyattn::fuzz::FuzzInput in(data, size);
  const uint8_t choice = in.Byte() % 9;
  const uint8_t flags = in.Byte();
  const std::string system = (flags & 1) ? Text(in) : "";
  const std::string question = Text(in);
  std::vector<std::string> docs((flags >> 2) & 3);
  for (std::string& d : docs) d = Text(in);
  // Choices 0-3 recognize a model-style text, 4-7 name the same four, 8 is fuzzed text.
  const std::string jinja = choice < 8 ? std::string(kJinja[choice % 4]) : Text(in);
  absl::StatusOr<ChatTemplate> tmpl =
      choice >= 4 && choice < 8 ? ChatTemplate::FromName(kNames[choice - 4])
                                : ChatTemplate::FromJinja(jinja);
  if (!tmpl.ok()) return 0;

  std::string content;
  for (const std::string& d : docs) content += d;
  content += question;
  std::vector<ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", content});
  const bool generation = (flags & 2) != 0;
  absl::StatusOr<std::string> rendered = tmpl->Apply(messages, generation);
  if (!rendered.ok()) return 0;
  if (tmpl->kind() == ChatTemplate::Kind::kChatML) {
    for (const ChatMessage& m : messages) Check(rendered->find(m.content) != std::string::npos);
  }

  // The rest goes through a tokenizer carrying the template, as a served model does.
  const lazyattn::TokenizerSpec* base = TinySpec();
  Check(base != nullptr);  // committed test data: its absence is a broken checkout
  lazyattn::TokenizerSpec spec = *base;
  spec.chat_template = jinja;
  auto tok = Tokenizer::Create(std::move(spec));
  Check(tok.ok());
  absl::StatusOr<lazyattn::PromptParts> parts =
      lazyattn::BuildPrompt(**tok, /*chat=*/true, system, question);
  if (!parts.ok()) return 0;
  absl::StatusOr<ChatTemplate> same = ChatTemplate::FromJinja((*tok)->chat_template());
  Check(same.ok());
  absl::StatusOr<std::string> whole = same->Apply(messages, /*add_generation_prompt=*/true);
  if (!whole.ok()) return 0;
  // Llama-3 trims the whole content; the cut trims only the question's end. They agree when the
  // content starts with a letter and the question holds one (so trimming stops inside it).
  const auto letter = [](char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; };
  if (content.empty() || !letter(content[0])) return 0;
  if (std::none_of(question.begin(), question.end(), letter)) return 0;
  std::string joined = parts->system_prefix;
  for (const std::string& d : docs) joined += d;
  joined += parts->question;
  Check(joined == *whole);

  for (const std::string& d : docs) {
    if (d.find('<') != std::string::npos) return 0;  // special-token text stays literal there
  }
  std::vector<Tokenizer::TextPart> text_parts = {{parts->system_prefix, true}};
  for (const std::string& d : docs) text_parts.push_back({d, false});
  text_parts.push_back({parts->question, true});
  Check((*tok)->EncodeParts(text_parts) == (*tok)->Encode(*whole, /*parse_special=*/true));
  return 0;
}
