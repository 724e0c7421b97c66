// What a worker says at start about its model's chat template: one it renders is reported in
// WorkerStatus; one it cannot render is named in a warning at start, since every request with
// `messages` or `chat` will then be refused and the operator would otherwise learn of it only
// from clients.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/server/worker_server.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct StartedWorker {
  std::string log;  // what the worker logged while it started
  v1::WorkerStatus status;
};

// Starts a worker whose tokenizer reports `chat_template`, capturing its log, and reads its
// status.
StartedWorker StartWithTemplate(const std::string& chat_template) {
  static const ModelWeights* weights = MakeRandomWeights(TinyTestConfig(), 11).release();
  const std::unique_ptr<Tokenizer> tokenizer = MakeByteTokenizer(chat_template);
  const std::string path = absl::StrCat(::testing::TempDir(), "/worker-template-log-", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  EXPECT_GE(fd, 0);
  SetLogSinkForTest(fd);
  WorkerServerOptions o;
  o.grpc.listen_address = "127.0.0.1:0";
  o.metrics_address = "";
  o.engine = {.num_kv_blocks = 64, .max_batch_tokens = 64, .max_running = 2};
  o.service.worker_id = "worker-under-test";
  o.shutdown_grace = absl::Seconds(1);
  auto server = WorkerServer::Create(o, weights, tokenizer.get());
  SetLogSinkForTest(STDERR_FILENO);
  close(fd);
  StartedWorker out;
  EXPECT_TRUE(server.ok()) << server.status();
  if (server.ok()) {
    auto stub = v1::Worker::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->Status(&ctx, {}, &out.status).ok());
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  out.log = text.str();
  return out;
}

TEST(WorkerChatTemplateTest, AnUnrenderableTemplateIsNamedInAWarningAtStart) {
  const StartedWorker w =
      StartWithTemplate("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}");
  EXPECT_THAT(w.log, HasSubstr("chat template is not one this worker renders"));
  EXPECT_THAT(w.log, HasSubstr("unrecognized chat template"));  // the reason, from FromJinja
  EXPECT_THAT(w.log, HasSubstr("[INST]"));                      // which quotes the template
  EXPECT_EQ(w.status.model().chat_template(), "");
}

TEST(WorkerChatTemplateTest, ARenderableTemplateIsReportedWithoutAWarning) {
  const StartedWorker w = StartWithTemplate(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}");
  EXPECT_THAT(w.log, Not(HasSubstr("chat template")));
  EXPECT_EQ(w.status.model().chat_template(), "chatml");
}

}  // namespace
}  // namespace lazyattn
