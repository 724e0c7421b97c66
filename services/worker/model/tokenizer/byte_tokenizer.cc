#include "services/worker/model/tokenizer/byte_tokenizer.h"

#include <string>
#include <utility>

namespace lazyattn {
namespace {

bool Printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

// GPT-2's byte-to-character map, so a 256-token byte vocabulary is a valid byte-level BPE vocab.
std::string ByteChar(int b) {
  int cp = b;
  if (!Printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += Printable(x) ? 0 : 1;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer(std::string chat_template) {
  TokenizerSpec spec;
  spec.chat_template = std::move(chat_template);
  spec.pre = "gpt2";
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(ByteChar(b));
  spec.tokens.push_back("<eos>");
  for (int i = 257; i < 300; ++i) spec.tokens.push_back("<unused" + std::to_string(i) + ">");
  spec.token_types.assign(300, static_cast<int32_t>(TokenType::kNormal));
  for (int i = 256; i < 300; ++i) spec.token_types[i] = static_cast<int32_t>(TokenType::kControl);
  spec.eos_id = 256;
  auto t = Tokenizer::Create(std::move(spec));
  return t.ok() ? std::move(*t) : nullptr;
}

}  // namespace lazyattn
