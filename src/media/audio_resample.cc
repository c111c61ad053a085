#include "media/audio_resample.h"

#include <fmt/format.h>
#include <soxr.h>

#include <memory>

#include "util/error.h"

namespace qs::media {
namespace {

struct SoxrDeleter {
  void operator()(soxr_t s) const { soxr_delete(s); }
};
using SoxrHandle = std::unique_ptr<std::remove_pointer_t<soxr_t>, SoxrDeleter>;

// What the soxr package's one-call `resample` creates: float32 interleaved I/O, the HQ recipe with no flags, the
// default runtime (one thread).
SoxrHandle make_resampler(int from_rate, int to_rate, std::string_view what) {
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
  soxr_error_t error = nullptr;
  SoxrHandle s(soxr_create(from_rate, to_rate, 1, &error, &io, &quality, nullptr));
  if (error || !s) throw Error(fmt::format("{}: cannot resample {} Hz to {} Hz ({})", what, from_rate, to_rate,
                                           error ? error : "soxr_create failed"));
  return s;
}

}  // namespace

std::vector<float> resample_hq(std::vector<float> mono, int from_rate, int to_rate, std::string_view what) {
  if (from_rate == to_rate) return mono;
  const size_t target = static_cast<size_t>((static_cast<uint64_t>(mono.size()) * to_rate + from_rate - 1) / from_rate);
  SoxrHandle s = make_resampler(from_rate, to_rate, what);
  std::vector<float> out(target + 1024);
  size_t consumed = 0, produced = 0;
  // Feed everything, then flush (null input) until soxr has nothing left; the buffer grows if soxr emits more.
  for (;;) {
    if (out.size() - produced < 1024) out.resize(out.size() * 2);
    const bool flushing = consumed == mono.size();
    size_t in_done = 0, out_done = 0;
    const soxr_error_t error =
        soxr_process(s.get(), flushing ? nullptr : mono.data() + consumed, mono.size() - consumed, &in_done,
                     out.data() + produced, out.size() - produced, &out_done);
    if (error) throw Error(fmt::format("{}: resampling {} Hz to {} Hz failed ({})", what, from_rate, to_rate, error));
    consumed += in_done;
    produced += out_done;
    if (flushing && out_done == 0) break;
  }
  out.resize(produced);
  out.resize(target, 0.0f);  // librosa's fix_length: pad with zeros or cut to the exact length
  return out;
}

}  // namespace qs::media
