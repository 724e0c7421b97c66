#include "services/router/server/admission.h"

#include <utility>

#include "absl/container/inlined_vector.h"
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
  return AdmitRequest(router, key_limiter, key_name, request, std::span(ticket, 1));
}

grpc::Status AdmitRequest(RouterContext* router, KeyLimiter* key_limiter,
                          const std::string& key_name, const lazyattn::v1::GenerateRequest& request,
                          std::span<AdmissionTicket> tickets) {
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
  const int places = static_cast<int>(tickets.size());
  if (places < 1) return grpc::Status(grpc::StatusCode::INTERNAL, "admission asked for no places");
  // The router's places are taken while the key's are reserved (KeyLimiter::Acquire), so a
  // refusal by either holds nothing of the other's.
  const auto router_places = [&]() -> grpc::Status {
    int in_flight = 0;
    if (router->TryAdmit(places, &in_flight)) return grpc::Status::OK;
    const int limit = router->options().max_inflight_requests;
    return refuse(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        places == 1
            ? absl::StrCat("router busy: ", limit,
                           " requests in flight (limits.max_inflight_requests); retry later")
            : absl::StrCat("router busy: ", in_flight, in_flight == 1 ? " request" : " requests",
                           " in flight, ", places,
                           " more would pass limits.max_inflight_requests (", limit,
                           "); retry later")));
  };
  absl::InlinedVector<KeySlot, 1> slots(tickets.size());
  const grpc::Status admitted =
      key_limiter != nullptr ? key_limiter->Acquire(key_name, std::span(slots), router_places)
                             : router_places();
  // The router's own refusal is counted above. A key's max_in_flight refusal is not counted in
  // lazyattn_router_requests_total, as its rate refusal is not (it happens before any handler):
  // both are the tenant's quota, counted in lazyattn_router_api_key_limited_total, and a server
  // error ratio that held them paged on one client's burst.
  if (!admitted.ok()) return admitted;
  for (int i = 0; i < places; ++i) {
    AdmissionTicket& ticket = tickets[i];
    ticket.Reset();
    ticket.router_ = router;
    ticket.key_slot_ = std::move(slots[i]);
  }
  return grpc::Status::OK;
}

}  // namespace lazyattn::router
