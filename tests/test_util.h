#pragma once
// Helpers shared by the tests: the largest value and difference of float arrays; the message of the error a call
// throws; a fresh temporary directory per test, removed afterwards; a fixture's tensor; the qatserve command run as
// a user would; the kernels run with each instruction set this CPU has.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "kernels/isa.h"
#include "kernels/linear.h"
#include "util/error.h"

namespace qs::test {

// The largest |x|, and the largest |a - b| (a and b of one length): the scale and the error of a comparison.
inline float max_abs(std::span<const float> x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

inline float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The message of the qs::Error that `f` throws; a call that throws none fails the test (and gives "").
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no qs::Error was thrown";
  return "";
}

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("qatserve-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" + std::to_string(getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// The values of tensor `name` of a safetensors file (tests/fixtures/*/reference.safetensors), copied out as T;
// empty, with a test failure naming it, when the file lacks it.
template <typename T>
std::vector<T> read_tensor(const SafetensorsFile& f, const std::string& name) {
  const TensorEntry* e = f.find(name);
  EXPECT_NE(e, nullptr) << "tensor " << name << " is missing";
  if (!e) return {};
  std::vector<T> out(e->nbytes() / sizeof(T));
  std::memcpy(out.data(), f.data(*e).data(), e->nbytes());
  return out;
}

// What the qatserve binary (QATSERVE_BINARY) did with a command line.
struct CliResult {
  int exit_code = -1;  // 128 + the signal when a signal ended it
  std::string output;  // stdout and stderr together
};

// Runs `qatserve ARGS` through the shell (ARGS quoted by the caller), with `env` (e.g. "NAME='value'") before it.
inline CliResult qatserve(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " '" + QATSERVE_BINARY + "' " + args + " 2>&1";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Forces the kernels' instruction set for a scope, then puts back the one before.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : before_(kernel_isa()) { set_kernel_isa(isa); }
  ~ScopedIsa() { set_kernel_isa(before_); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa before_;
};

// Runs f once with each instruction set this CPU has (a failure names it).
template <typename F>
void for_each_isa(F f) {
  for (Isa isa : cpu_isas()) {
    SCOPED_TRACE(std::string("kernels: ") + isa_name(isa));
    const ScopedIsa scoped(isa);
    f();
  }
}

// Forces how bf16 products are taken (bf16 dot products where exact, or f32 FMA) for a scope, then back to Auto.
class ScopedBf16Multiply {
 public:
  explicit ScopedBf16Multiply(Bf16Multiply how) { set_bf16_multiply(how); }
  ~ScopedBf16Multiply() { set_bf16_multiply(Bf16Multiply::Auto); }
  ScopedBf16Multiply(const ScopedBf16Multiply&) = delete;
  ScopedBf16Multiply& operator=(const ScopedBf16Multiply&) = delete;
};

// for_each_isa, AVX-512 once with bf16 dot products (where the CPU has them) and once with f32 FMA.
template <typename F>
void for_each_kernel_path(F f) {
  for (Bf16Multiply how : {Bf16Multiply::DotProducts, Bf16Multiply::Fma}) {
    SCOPED_TRACE(how == Bf16Multiply::Fma ? "bf16 products by f32 FMA" : "bf16 dot products where exact");
    const ScopedBf16Multiply scoped(how);
    for_each_isa(f);
  }
}

}  // namespace qs::test
