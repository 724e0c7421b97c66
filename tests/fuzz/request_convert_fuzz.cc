// Serialized lazyattn.v1 requests, as the router's Inference service and the worker's Worker
// service receive them (both take GenerateRequest and PrefetchRequest), through the shared
// validator, the worker's conversion to an EngineRequest and the engine's preparation
// (tokenization, document keys). Nothing may crash, and every refusal is INVALID_ARGUMENT whose
// message starts with the request field it is about.
//
// Input: byte 0 picks the message (even: GenerateRequest, odd: PrefetchRequest) and the limits
// (bit 1: small limits, so the size checks are reached by small inputs); the rest is the
// serialized message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/request_validator.h"
#include "lazyattn/v1/inference.pb.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/server/request_convert.h"

namespace {

using lazyattn::ApiLimits;

constexpr size_t kMaxInput = 256 << 10;  // keeps one input well under 100 ms

// Read-only after the first call: no state carries from one input to the next.
struct Fixture {
  std::unique_ptr<lazyattn::Tokenizer> tokenizer = lazyattn::MakeByteTokenizer();
  lazyattn::ModelConfig config = lazyattn::TinyTestConfig();
  lazyattn::ModelIdentity identity{"fuzz-model", "fuzz-tokenizer"};
};

const Fixture& GetFixture() {
  static const Fixture* const fixture = new Fixture();
  return *fixture;
}

// A refusal must be INVALID_ARGUMENT naming a request field ("documents[2].text: ...").
void CheckRefusal(const absl::Status& status) {
  if (status.ok()) return;
  if (status.code() != absl::StatusCode::kInvalidArgument) std::abort();
  const std::string m(status.message());
  for (std::string_view field : {"system", "question", "documents", "sampling.", "cache_mode",
                                 "replicas", "chat", "prompt", "messages"}) {
    if (std::string_view(m).substr(0, field.size()) == field) return;
  }
  std::abort();
}

ApiLimits Limits(bool small) {
  ApiLimits l;
  if (small) {
    l.max_documents = 3;
    l.max_document_bytes = 64;
    l.max_document_tokens = 16;
    l.max_document_id_bytes = 8;
    l.max_system_bytes = 32;
    l.max_question_bytes = 32;
    l.max_tokens = 8;
    l.max_stop_strings = 2;
    l.max_stop_bytes = 4;
    l.max_stop_token_ids = 2;
    l.max_prefetch_replicas = 2;
  }
  return l;
}

void Prepare(const lazyattn::EngineRequest& request, const Fixture& f) {
  lazyattn::RequestLimits limits;
  auto prepared = lazyattn::PrepareRequest(request, *f.tokenizer, f.config, f.identity, limits);
  CheckRefusal(prepared.status());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > kMaxInput) return 0;
  const Fixture& f = GetFixture();
  const uint8_t selector = data[0];
  const ApiLimits limits = Limits((selector & 2) != 0);
  const void* body = data + 1;
  const int body_size = static_cast<int>(size - 1);

  if ((selector & 1) == 0) {
    lazyattn::v1::GenerateRequest request;
    if (!request.ParseFromArray(body, body_size)) return 0;
    const absl::Status valid = lazyattn::ValidateGenerateRequest(request, limits,
                                                                 f.config.vocab_size);
    CheckRefusal(valid);
    // The worker never trusts that the validator ran: convert either way.
    auto converted =
        lazyattn::EngineRequestFromProto(request, *f.tokenizer, f.config, {.default_max_tokens = 4});
    CheckRefusal(converted.status());
    if (valid.ok() && converted.ok()) Prepare(*converted, f);
  } else {
    lazyattn::v1::PrefetchRequest request;
    if (!request.ParseFromArray(body, body_size)) return 0;
    const absl::Status valid = lazyattn::ValidatePrefetchRequest(request, limits,
                                                                 f.config.vocab_size);
    CheckRefusal(valid);
    auto converted = lazyattn::PrefetchEngineRequest(request);
    CheckRefusal(converted.status());
    if (valid.ok() && converted.ok()) Prepare(*converted, f);
  }
  return 0;
}
