// What an operator configures on `qatserve serve`: the API key from a file or the environment, the log line
// formats, the --served-model-name check (vLLM's 404), and the flags' errors from the command itself. The live
// checks (the openai client, json.loads on the log, a real key) are in tests/server/server_options_checks.py.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "server/http_server.h"
#include "server/lora_registry.h"
#include "server/openai_protocol.h"
#include "server/server_log.h"
#include "test_util.h"
#include "util/error.h"

namespace {

using namespace qs;
namespace fs = std::filesystem;

using qs::test::error_of;

TEST(ServeOptions, ApiKeyFromFlagFileOrEnvironment) {
  test::TempDir tmp;
  std::ofstream(tmp / "key") << "sk-from-file\n";
  EXPECT_EQ(resolve_api_key("sk-flag", "", "sk-env"), "sk-flag");
  EXPECT_EQ(resolve_api_key("", tmp / "key", "sk-env"), "sk-from-file");  // a file beats the environment
  EXPECT_EQ(resolve_api_key("", "", "sk-env"), "sk-env");
  EXPECT_EQ(resolve_api_key("", "", nullptr), "");  // no key: no authentication

  const std::string missing = error_of([&] { resolve_api_key("", tmp / "absent", nullptr); });
  EXPECT_NE(missing.find("--api-key-file"), std::string::npos) << missing;
  EXPECT_NE(missing.find((tmp / "absent").string()), std::string::npos) << missing;

  std::ofstream(tmp / "empty") << "\n";
  const std::string empty = error_of([&] { resolve_api_key("", tmp / "empty", "sk-env"); });
  EXPECT_NE(empty.find((tmp / "empty").string()), std::string::npos) << empty;
  EXPECT_NE(empty.find("empty"), std::string::npos) << empty;

  std::ofstream(tmp / "two") << "a\nb\n";
  const std::string two = error_of([&] { resolve_api_key("", tmp / "two", nullptr); });
  EXPECT_NE(two.find("one line"), std::string::npos) << two;
}

TEST(ServeOptions, LogLinesTextAndJson) {
  const nlohmann::ordered_json fields = {{"id", "chatcmpl-1"}, {"prompt_tokens", 12}, {"ttft_s", nullptr}};
  EXPECT_EQ(ServerLog(LogFormat::Text).line("request", "chatcmpl-1 /v1/chat/completions n=1", fields, "info"),
            "serve: chatcmpl-1 /v1/chat/completions n=1");
  const std::string line =
      ServerLog(LogFormat::Json).line("request", "chatcmpl-1 /v1/chat/completions n=1", fields, "info");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["event"], "request");
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["message"], "chatcmpl-1 /v1/chat/completions n=1");
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["prompt_tokens"], 12);
  EXPECT_TRUE(j["ttft_s"].is_null());
  EXPECT_EQ(j["time"].get<std::string>().back(), 'Z');
  // Invalid UTF-8 in a message (a path, an error) still makes one valid JSON line.
  EXPECT_NO_THROW(nlohmann::json::parse(ServerLog(LogFormat::Json).line("x", "bad \xff byte", nullptr, "warning")));

  EXPECT_EQ(parse_log_format("json"), LogFormat::Json);
  const std::string bad = error_of([] { parse_log_format("xml"); });
  EXPECT_NE(bad.find("--log-format 'xml'"), std::string::npos) << bad;
}

// vLLM answers a request for a model it does not serve with 404 {"error": {"message": "The model `X` does not
// exist.", "type": "NotFoundError", "param": ..., "code": 404}} (vllm/entrypoints/openai serving `_check_model`).
TEST(ServeOptions, ServedModelNameAnswersOtherNamesWith404) {
  ServedModel m;
  m.name = "gemma-4-e2b";
  m.strict_name = true;
  const nlohmann::json body = {{"model", "gpt-4o"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  try {
    parse_chat_request(body, m);
    ADD_FAILURE() << "a request for another model was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
    auto b = error_body(e);
    EXPECT_EQ(b["error"]["message"], "The model `gpt-4o` does not exist.");
    EXPECT_EQ(b["error"]["type"], "NotFoundError");
    EXPECT_EQ(b["error"]["code"], 404);  // a number, as vLLM sends it
  }
  try {
    parse_completion_request({{"model", "other"}, {"prompt", "x"}}, m);
    ADD_FAILURE() << "a completion for another model was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
  }
  // OpenAI's word codes stay strings.
  EXPECT_EQ(error_body(ApiError(401, "no", "", "invalid_request_error", "invalid_api_key"))["error"]["code"],
            "invalid_api_key");
}

// --lora NAME=DIR: both parts, else an error naming the flag and the form.
TEST(ServeOptions, LoraFlagNeedsNameAndDir) {
  const ServedAdapter a = parse_lora_module("tuned=adapters/tuned=v2");
  EXPECT_EQ(a.name, "tuned");
  EXPECT_EQ(a.dir, "adapters/tuned=v2");
  for (const char* bad : {"tuned", "=dir", "tuned="}) {
    const std::string e = error_of([&] { parse_lora_module(bad); });
    EXPECT_NE(e.find("expected NAME=DIR"), std::string::npos) << e;
  }
}

using test::CliResult;
using test::qatserve;

// The flags' errors come before any model is read.
TEST(ServeOptions, CliFlagErrors) {
  test::TempDir tmp;
  CliResult key = qatserve("serve --model '" + (tmp / "m").string() + "' --api-key-file '" +
                           (tmp / "no-key").string() + "'");
  EXPECT_EQ(key.exit_code, 1) << key.output;
  EXPECT_NE(key.output.find("--api-key-file"), std::string::npos) << key.output;
  EXPECT_NE(key.output.find((tmp / "no-key").string()), std::string::npos) << key.output;

  CliResult both = qatserve("serve --model m --api-key k --api-key-file f");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("excludes"), std::string::npos) << both.output;

  CliResult format = qatserve("serve --model m --log-format xml");
  EXPECT_NE(format.exit_code, 0);
  EXPECT_NE(format.output.find("--log-format"), std::string::npos) << format.output;

  for (const char* flag : {"--max-model-len 0", "--threads 0", "--max-model-len -5", "--max-connections 0",
                           "--header-timeout 0", "--body-timeout -1", "--max-body-bytes 0",
                           "--max-body-bytes 1023", "--max-body-bytes 1073741825", "--max-body-bytes 8M"}) {
    CliResult r = qatserve(std::string("serve --model m ") + flag);
    EXPECT_NE(r.exit_code, 0) << flag;
  }
  CliResult help = qatserve("serve --help");
  for (const char* flag : {"--served-model-name", "--max-model-len", "--threads", "--api-key-file", "--log-format",
                           "--max-connections", "--header-timeout", "--body-timeout", "--max-body-bytes"})
    EXPECT_NE(help.output.find(flag), std::string::npos) << flag;
  EXPECT_NE(help.output.find("ps"), std::string::npos) << "the --api-key help warns about ps";
}

}  // namespace
