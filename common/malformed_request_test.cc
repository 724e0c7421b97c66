// Malformed request bytes against a callback service started by StartGrpcServer: INVALID_ARGUMENT
// naming `request` (gRPC alone would answer UNIMPLEMENTED with no message), for unary and
// server-streaming methods; well-formed calls, unknown methods and the service's own statuses
// are left as they were.
#include "common/malformed_request.h"

#include <grpcpp/generic/generic_stub.h>

#include "absl/synchronization/notification.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "lazyattn/v1/inference.grpc.pb.h"

namespace lazyattn {
namespace {

// Answers Complete with OK, or with UNIMPLEMENTED of its own when the question asks for it, and
// streams one event from Generate.
class TinyInference final : public v1::Inference::CallbackService {
  grpc::ServerUnaryReactor* Complete(grpc::CallbackServerContext* context,
                                     const v1::GenerateRequest* request,
                                     v1::CompleteResponse* response) override {
    auto* reactor = context->DefaultReactor();
    if (request->question() == "unimplemented") {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, ""));
    } else {
      response->set_text("ok");
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* /*context*/, const v1::GenerateRequest* /*request*/) override {
    class OneEvent final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
     public:
      OneEvent() {
        event_.mutable_final()->set_finish_reason("stop");
        StartWriteAndFinish(&event_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      v1::GenerateResponse event_;
    };
    return new OneEvent;
  }
};

class MalformedRequestTest : public testing::Test {
 protected:
  void SetUp() override {
    auto built = StartGrpcServer({.listen_address = "127.0.0.1:0"}, {&service_});
    ASSERT_TRUE(built.ok()) << built.status();
    server_ = std::move(built->server);
    auto channel = MakeChannel("127.0.0.1:" + std::to_string(built->port), {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    stub_ = std::make_unique<grpc::GenericStub>(*channel);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // One unary call with `bytes` as the request; the status, and the response bytes in `reply`.
  grpc::Status Unary(const std::string& method, const std::string& bytes,
                     std::string* reply = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::Status status;
    absl::Notification done;
    stub_->UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                     [&](grpc::Status s) {
                       status = std::move(s);
                       done.Notify();
                     });
    done.WaitForNotification();
    if (reply != nullptr && status.ok()) {
      std::vector<grpc::Slice> slices;
      (void)response.Dump(&slices);
      reply->clear();
      for (const grpc::Slice& s : slices) reply->append(s.begin(), s.end());
    }
    return status;
  }

  TinyInference service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

// A field 2 (documents) whose length runs past the end of the message: no parser accepts it.
const std::string kTruncated("\x12\x7f\x0a", 3);

TEST_F(MalformedRequestTest, UnparsableUnaryRequestIsInvalidArgumentNamingRequest) {
  const grpc::Status s = Unary("/lazyattn.v1.Inference/Complete", kTruncated);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("request:"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("/lazyattn.v1.Inference/Complete"), std::string::npos)
      << s.error_message();
  // Another kind of garbage: an invalid wire type (7).
  const grpc::Status t = Unary("/lazyattn.v1.Inference/Complete", std::string("\x0f\x01", 2));
  EXPECT_EQ(t.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << t.error_message();
}

TEST_F(MalformedRequestTest, UnparsableStreamingRequestIsInvalidArgumentNamingRequest) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = stub_->PrepareCall(&context, "/lazyattn.v1.Inference/Generate", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Slice slice(kTruncated);
  grpc::ByteBuffer request(&slice, 1);
  call->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::ByteBuffer event;
  call->Read(&event, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_FALSE(ok) << "no event for a request that does not parse";
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("request:"), std::string::npos) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(MalformedRequestTest, WellFormedCallsAndOtherStatusesAreUntouched) {
  v1::GenerateRequest request;
  request.set_question("hello");
  std::string reply;
  ASSERT_TRUE(Unary("/lazyattn.v1.Inference/Complete", request.SerializeAsString(), &reply).ok());
  v1::CompleteResponse response;
  ASSERT_TRUE(response.ParseFromString(reply));
  EXPECT_EQ(response.text(), "ok");
  // An empty message is a valid one (every field at its default).
  EXPECT_TRUE(Unary("/lazyattn.v1.Inference/Complete", "").ok());
  // The service's own UNIMPLEMENTED after a request that parsed stays as it was sent.
  request.set_question("unimplemented");
  const grpc::Status own = Unary("/lazyattn.v1.Inference/Complete", request.SerializeAsString());
  EXPECT_EQ(own.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(own.error_message(), "");
  // A method the server does not have is still UNIMPLEMENTED, whatever its bytes.
  const grpc::Status unknown = Unary("/lazyattn.v1.Inference/NoSuchMethod", kTruncated);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNIMPLEMENTED) << unknown.error_message();
}

}  // namespace
}  // namespace lazyattn
