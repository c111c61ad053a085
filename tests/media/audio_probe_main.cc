// audio_probe: the media layer's audio entry points on files, for tools/python/check_audio_external.py to hold
// against transformers.
//   audio_probe decode FILE FORMAT_HINT OUT.f32             decode_audio -> raw float32 samples (16 kHz mono)
//   audio_probe features IN.f32 MODEL_DIR OUT_PREFIX        extract_audio_features with MODEL_DIR's options ->
//                                                            OUT_PREFIX.f32 (features) and OUT_PREFIX.json
// Exit 1 with the error message on stderr when the call throws.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "media/audio_decode.h"
#include "media/audio_features.h"
#include "util/error.h"
#include "util/file.h"

namespace {

void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = qs::read_file(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

int run(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "decode" && argc == 5) {
    const std::string bytes = qs::read_file(argv[2]);
    const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    write_floats(argv[4], qs::media::decode_audio(span, argv[3], {.max_bytes = 1 << 28, .max_seconds = 600}, argv[2]));
    return 0;
  }
  if (command == "features" && argc == 5) {
    const auto options = qs::media::read_audio_feature_options(argv[3]);
    const auto f = qs::media::extract_audio_features(read_floats(argv[2]), options);
    write_floats(std::string(argv[4]) + ".f32", f.features);
    const nlohmann::json info = {{"num_frames", f.num_frames}, {"num_mel", f.num_mel}, {"mask", f.mask},
                                 {"num_soft_tokens", f.num_soft_tokens}};
    std::ofstream(std::string(argv[4]) + ".json") << info.dump();
    return 0;
  }
  std::fprintf(stderr, "usage: audio_probe decode FILE FORMAT_HINT OUT.f32 | features IN.f32 MODEL_DIR OUT_PREFIX\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const qs::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
