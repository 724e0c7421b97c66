// Test helper: a KvDirectory that records what workers publish and can send them messages.
// Synchronous gRPC API (simple for a test): one handler thread per Publish stream.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_TESTING_FAKE_KVDIR_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_TESTING_FAKE_KVDIR_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "lazyattn/v1/kvdir.grpc.pb.h"

namespace lazyattn::testing {

class FakeKvdir final : public v1::KvDirectory::Service {
 public:
  using Stream = grpc::ServerReaderWriter<v1::DirectoryMessage, v1::WorkerMessage>;

  // Port 0: the OS picks one. Returns false when it cannot bind. A connection age (and its
  // grace) other than the servers' default closes connections as kvdir does at its age.
  bool Start(int port = 0, int max_connection_age_ms = kMaxConnectionAgeMs,
             int max_connection_age_grace_ms = kNoConnectionGraceLimit) {
    ServerOptions options;
    options.listen_address = absl::StrCat("127.0.0.1:", port);
    options.max_connection_age_ms = max_connection_age_ms;
    options.max_connection_age_grace_ms = max_connection_age_grace_ms;
    auto built = StartGrpcServer(options, {this});
    if (!built.ok()) return false;
    server_ = std::move(built->server);
    port_ = built->port;
    return true;
  }
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    server_->Wait();
    server_.reset();
  }
  ~FakeKvdir() override { Stop(); }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::Status Publish(grpc::ServerContext* context, Stream* stream) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = stream;
      ++streams_;
    }
    v1::WorkerMessage m;
    while (stream->Read(&m)) {
      std::lock_guard<std::mutex> lock(mu_);
      messages_.push_back(m);
      cv_.notify_all();
      if (!refusal_.ok()) break;  // refuses the stream after its first message (the Hello)
    }
    std::lock_guard<std::mutex> write_lock(write_mu_);  // no Send in flight on this stream
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = nullptr;
    cv_.notify_all();
    if (!refusal_.ok()) {
      for (const auto& [key, value] : refusal_trailers_) context->AddTrailingMetadata(key, value);
    }
    return refusal_;
  }

  // Not OK: every later stream is ended with `status` right after its Hello, with `trailers` as
  // its trailing metadata, as kvdir refuses a worker over its limits or for an id another worker
  // holds; OK: streams are accepted again.
  void SetRefusal(const grpc::Status& status,
                  std::vector<std::pair<std::string, std::string>> trailers = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    refusal_ = status;
    refusal_trailers_ = std::move(trailers);
  }

  bool Send(const v1::DirectoryMessage& m) {
    std::lock_guard<std::mutex> write_lock(write_mu_);
    Stream* s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = stream_;
    }
    return s != nullptr && s->Write(m);
  }
  bool RequestSnapshot(const std::string& reason) {
    v1::DirectoryMessage m;
    m.mutable_snapshot_request()->set_reason(reason);
    return Send(m);
  }

  // Waits until `pred(messages)` holds; false after `timeout`.
  bool WaitFor(const std::function<bool(const std::vector<v1::WorkerMessage>&)>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(messages_); });
  }
  std::vector<v1::WorkerMessage> messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  int streams() {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex write_mu_;  // before mu_
  std::mutex mu_;
  std::condition_variable cv_;
  Stream* stream_ = nullptr;
  int streams_ = 0;
  grpc::Status refusal_;
  std::vector<std::pair<std::string, std::string>> refusal_trailers_;
  std::vector<v1::WorkerMessage> messages_;
};

}  // namespace lazyattn::testing

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_TESTING_FAKE_KVDIR_H_
