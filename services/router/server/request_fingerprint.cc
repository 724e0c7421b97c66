#include "services/router/server/request_fingerprint.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <string>

#include "absl/strings/numbers.h"

namespace lazyattn::router {

RequestFingerprint FingerprintOf(const lazyattn::v1::GenerateRequest& request) {
  std::string bytes = "lazyattn-request-v1\n";
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);  // map fields (none today) in a stable order
    request.SerializeToCodedStream(&out);
  }
  const std::string hex = Sha256Hex(bytes);
  RequestFingerprint fp;
  // Sha256Hex gives 64 lowercase hex digits; these always parse.
  (void)absl::SimpleHexAtoi(hex.substr(0, 16), &fp.hi);
  (void)absl::SimpleHexAtoi(hex.substr(16, 16), &fp.lo);
  return fp;
}

}  // namespace lazyattn::router
