#include "services/worker/model/model_fingerprint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/document_key.h"

namespace lazyattn {
namespace {

void AppendSample(const std::vector<float>& v, std::string& out) {
  constexpr size_t kSample = 4096;
  const size_t head = std::min(kSample, v.size());
  out.append(reinterpret_cast<const char*>(v.data()), head * sizeof(float));
  const size_t tail_start = v.size() - std::min(kSample, v.size());
  out.append(reinterpret_cast<const char*>(v.data() + tail_start), (v.size() - tail_start) * sizeof(float));
}

}  // namespace

std::string ModelFingerprint(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  std::string bytes = absl::StrCat("llama|", c.vocab_size, "|", c.hidden_size, "|",
                                   c.intermediate_size, "|", c.num_layers, "|", c.num_heads, "|",
                                   c.num_kv_heads, "|", c.head_dim, "|", c.rms_norm_eps, "|",
                                   c.rope.theta, "|", c.max_positions, "|");
  for (double f : RopeInverseFrequencies(c.rope)) absl::StrAppend(&bytes, f, ",");
  AppendSample(w.token_embedding, bytes);
  AppendSample(w.output_norm, bytes);
  AppendSample(w.lm_head, bytes);
  for (const LayerWeights& l : w.layers) {
    for (const auto* v : {&l.attn_norm, &l.wqkv, &l.wo, &l.ffn_norm, &l.w_gate_up, &l.w_down}) {
      AppendSample(*v, bytes);
    }
  }
  return Sha256Hex(bytes);
}

std::string TokenizerFingerprint(const Tokenizer& t) {
  std::string bytes = absl::StrCat(static_cast<int>(t.pre_tokenizer()), "|", t.bos_id(), "|",
                                   t.eos_id(), "|", t.add_bos(), "|");
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    const auto text = t.TokenText(id);
    absl::StrAppend(&bytes, text.size(), ":");
    bytes.append(text.data(), text.size());
    absl::StrAppend(&bytes, static_cast<int>(t.token_type(id)), "|");
  }
  return Sha256Hex(bytes);
}

}  // namespace lazyattn
