#include "services/router/server/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/request_validator.h"

namespace lazyattn::router {

AdmissionTicket::AdmissionTicket(AdmissionTicket&& other) noexcept
    : router_(std::exchange(other.router_, nullptr)), key_slot_(std::move(other.key_slot_)) {}

AdmissionTicket& AdmissionTicket::operator=(AdmissionTicket&& other) noexcept {
  if (this != &other) {
    Reset();
    router_ = std::exchange(other.router_, nullptr);
    key_slot_ = std::move(other.key_slot_);
  }
  return *this;
}

AdmissionTicket::~AdmissionTicket() { Reset(); }

void AdmissionTicket::Reset() {
  if (router_ != nullptr) std::exchange(router_, nullptr)->Release();
  key_slot_ = KeySlot();
}

grpc::Status AdmitRequest(RouterContext* router, KeyLimiter* key_limiter,
                          const std::string& key_name, const lazyattn::v1::GenerateRequest& request,
                          AdmissionTicket* ticket) {
  const auto refuse = [router](const grpc::Status& s) {
    router->metrics().CountRequest(s.error_code());
    return s;
  };
  const auto model = router->registry().Model();
  const absl::Status valid = ValidateGenerateRequest(request, router->options().limits,
                                                     model.has_value() ? model->vocab_size() : 0);
  if (!valid.ok()) {
    router->metrics().CountValidationFailure(valid);
    return refuse(ToGrpcStatus(valid));
  }
  // The workers would refuse it after routing (and the router would count it against them); the
  // limit is the one GetModelInfo reports.
  if (model.has_value() && model->max_documents() > 0 &&
      request.documents_size() > model->max_documents()) {
    const absl::Status too_many =
        absl::InvalidArgumentError(absl::StrCat("documents: ", request.documents_size(),
                                                " documents, the served model's "
                                                "workers take at most ",
                                                model->max_documents(), " (GetModelInfo)"));
    return refuse(ToGrpcStatus(too_many));
  }
  return AdmitAnotherPlace(router, key_limiter, key_name, ticket);
}

grpc::Status AdmitAnotherPlace(RouterContext* router, KeyLimiter* key_limiter,
                               const std::string& key_name, AdmissionTicket* ticket) {
  const auto refuse = [router](const grpc::Status& s) {
    router->metrics().CountRequest(s.error_code());
    return s;
  };
  KeySlot slot;
  if (key_limiter != nullptr) {
    if (grpc::Status s = key_limiter->Acquire(key_name, &slot); !s.ok()) return refuse(s);
  }
  if (!router->TryAdmit()) {
    return refuse(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("router busy: ", router->options().max_inflight_requests,
                     " requests in flight (limits.max_inflight_requests); retry later")));
  }
  ticket->Reset();
  ticket->router_ = router;
  ticket->key_slot_ = std::move(slot);
  return grpc::Status::OK;
}

}  // namespace lazyattn::router
