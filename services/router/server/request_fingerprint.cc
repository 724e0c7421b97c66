#include "services/router/server/request_fingerprint.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lazyattn::router {

RequestFingerprint FingerprintOf(const lazyattn::v1::GenerateRequest& request,
                                 const ModelKey* model) {
  std::string bytes = "lazyattn-request-v2\n";
  if (model != nullptr) {
    // Length-prefixed, so no two fingerprint splits collide.
    absl::StrAppend(&bytes, model->model_fingerprint.size(), ":", model->model_fingerprint,
                    model->tokenizer_fingerprint.size(), ":", model->tokenizer_fingerprint);
  }
  bytes += '\n';
  // The copy (only when a model is named) keeps the name's spelling out of the content.
  std::optional<lazyattn::v1::GenerateRequest> unnamed;
  if (!request.model().empty()) {
    unnamed.emplace(request);
    unnamed->clear_model();
  }
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);  // map fields (sampling.logit_bias) in a stable order
    (unnamed.has_value() ? *unnamed : request).SerializeToCodedStream(&out);
  }
  const std::string hex = Sha256Hex(bytes);
  RequestFingerprint fp;
  // Sha256Hex gives 64 lowercase hex digits; these always parse.
  (void)absl::SimpleHexAtoi(hex.substr(0, 16), &fp.hi);
  (void)absl::SimpleHexAtoi(hex.substr(16, 16), &fp.lo);
  return fp;
}

}  // namespace lazyattn::router
